"""Evaluate a ValidatingAdmissionPolicy's CEL the way kube-apiserver does, with cel-python.

There is no 1.30 API server here, so the policy's expressions run in `celpy` (a
pure-Python CEL implementation) with the variables kube-apiserver binds: `request`,
`object`, `oldObject` and `variables`. What the API server does and celpy does not:

- type-check each expression against the Pod's OpenAPI schema when the policy is
  created. `unknown_fields` stands in for that: it resolves every field path the
  expressions name through the kubernetes client's models, so a misspelt field fails
  a test instead of quietly reading as absent;
- estimate and cap the expressions' cost (ours are linear in the number of containers);
- report which validation failed on an evaluation error. An error here counts as a
  denial, as `failurePolicy: Fail` makes it.

celpy follows the CEL spec where it matters to these expressions: `has()` on absent
map keys, `||`/`&&` absorbing an error when the other side decides, `all()`, `in` on
maps, `size()`. `test_cel_semantics_the_policy_relies_on` pins those down.
"""

from __future__ import annotations

import re
from typing import Any

import celpy
from celpy import celtypes
from kubernetes import client

Obj = dict[str, Any]
_ENV = celpy.Environment()


def _run(expression: str, activation: dict[str, Any]) -> Any:
    """The expression's value, or the CELEvalError it ended in."""
    try:
        return _ENV.program(_ENV.compile(expression)).evaluate(activation)
    except celpy.CELEvalError as exc:
        return exc


def _cel(value: Any) -> Any:
    return celpy.json_to_cel(value)


def admission_request(
    operation: str,
    username: str,
    obj: Obj | None,
    old: Obj | None = None,
    resource: tuple[str, str, str] = ("", "v1", "pods"),
) -> dict[str, Any]:
    group, version, plural = resource
    return {
        "request": {
            "operation": operation,
            "userInfo": {"username": username, "groups": ["system:serviceaccounts"]},
            "resource": {"group": group, "version": version, "resource": plural},
            "subResource": "",
        },
        "object": obj,
        "oldObject": old,
    }


def matches(policy: Obj, resource: str, operation: str) -> bool:
    rules = policy["spec"]["matchConstraints"]["resourceRules"]
    return any(operation in r["operations"] and resource in r["resources"] for r in rules)


def denials(policy: Obj, review: dict[str, Any], resource: str = "pods") -> list[str]:
    """The messages kube-apiserver would deny `review` with; [] when admitted."""
    spec = policy["spec"]
    assert spec["failurePolicy"] == "Fail"
    if not matches(policy, resource, review["request"]["operation"]):
        return []
    activation: dict[str, Any] = {k: _cel(v) for k, v in review.items()}
    for condition in spec.get("matchConditions", []):
        result = _run(condition["expression"], activation)
        if isinstance(result, celpy.CELEvalError):
            return [f"matchCondition {condition['name']}: {result}"]
        if not result:
            return []
    variables: dict[celtypes.StringType, Any] = {}
    for variable in spec.get("variables", []):
        activation["variables"] = celtypes.MapType(variables)
        variables[celtypes.StringType(variable["name"])] = _run(variable["expression"], activation)
    activation["variables"] = celtypes.MapType(variables)
    denied = []
    for validation in spec["validations"]:
        result = _run(validation["expression"], activation)
        if isinstance(result, celpy.CELEvalError):
            denied.append(f"{validation['message']} (error: {result})")
        elif not isinstance(result, celtypes.BoolType):
            raise AssertionError(f"{validation['expression']!r} gave {result!r}, not a bool")
        elif not result:
            denied.append(validation["message"])
    return denied


# -- field paths against the Pod's schema --------------------------------------------------

# Names bound by the expressions' macros, and the model each ranges over, per resource.
_MACRO_ROOTS = {
    "c": client.V1Container,
    "e": client.V1EnvVar,
    "x": client.CoreV1ResourceClaim,
    "rc": client.V1PodResourceClaim,
    "r": client.V1OwnerReference,
    "p": client.V1ContainerPort,
    "q": client.V1DeviceRequest,
    "s": client.V1DeviceSelector,
}
_ROOTS = {
    "pods": {"object": client.V1Pod, "oldObject": client.V1Pod, "variables.pod": client.V1Pod},
    "resourceclaims": {
        "object": client.ResourceV1ResourceClaim,
        "oldObject": client.ResourceV1ResourceClaim,
        "variables.claim": client.ResourceV1ResourceClaim,
    },
}
_REQUEST_FIELDS = {"operation", "userInfo", "username"}
_PATH = re.compile(
    r"(?<![\w.'])(object|oldObject|variables\.pod|variables\.claim|c|e|x|rc|r|p|q|s|request)"
    r"((?:\.\w+)+)"
)
_METHODS = {"size", "all", "exists", "exists_one", "map", "filter", "startsWith", "matches"}


def unknown_fields(expression: str, resource: str = "pods") -> list[str]:
    """Field paths in `expression` that the resource's schema does not have."""
    roots: dict[str, Any] = {**_ROOTS[resource], **_MACRO_ROOTS}
    unknown = []
    for root, rest in _PATH.findall(expression):
        parts = rest.strip(".").split(".")
        if root == "request":
            unknown += [f"request.{p}" for p in parts if p not in _REQUEST_FIELDS]
            continue
        if root not in roots:
            unknown.append(f"{root}{rest}: {root} is not bound for {resource}")
            continue
        model: Any = roots[root]
        for part in parts:
            if part in _METHODS:
                break
            by_json = {v: k for k, v in model.attribute_map.items()}
            if part not in by_json:
                unknown.append(f"{root}{rest}: {part} is not a field of {model.__name__}")
                break
            kind = model.openapi_types[by_json[part]]
            model = getattr(client, kind, None)
            if model is None:  # a list, a map or a scalar: nothing further to resolve
                break
    return unknown
