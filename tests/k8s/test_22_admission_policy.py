"""Flow 22: the chart's ValidatingAdmissionPolicies, enforced by the API server itself.

tests/deploy/test_admission_policy.py runs the policies' CEL in cel-python (the fast
check). Here the chart's own policies, installed by `helm install` (admissionPolicy.enabled
auto), judge what the agent's ServiceAccount sends: impersonated from the admin's
kubeconfig, the way `kubectl --as` does. The objects are the agent's own, built by its
code with the release's flags for a real pod on the node, and each is admitted unchanged
(and deleted again): so a refusal of a variant from the shared table
(tests/deploy/admission_cases.py) is the policy's doing, not the shape's. The table's
changes (HOSTILE_UPDATES) are merge patches the agent's account sends to a pod that exists,
made by the admin as its owner would make it; the agent's own hand-over is admitted. Each
answer is compared with cel-python's (tests/deploy/admission.py) for the same object and
the policy as installed: where the two differ, this file says so
(FIRST_REFUSED_BY_ANOTHER_RULE).
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

import pytest
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from agent.kube.client import PodInfo
from tests.deploy.admission import admission_request, denials
from tests.deploy.admission_cases import (
    HAND_OVER,
    HOSTILE,
    HOSTILE_BLOCKERS,
    HOSTILE_CLAIMS,
    HOSTILE_UPDATES,
    Obj,
    agents_objects,
    merge_patch,
)
from tests.deploy.support import agent_argv
from tests.k8s import flows
from tests.k8s.flows import NVML_GPUS
from tests.k8s.node.cluster import Node

POD_POLICY = f"{flows.RELEASE}-holder-pods"
CLAIM_POLICY = f"{flows.RELEASE}-pin-claims"
RESOURCES = {
    "Pod": ("", "v1", "pods"),
    "ResourceClaim": ("resource.k8s.io", "v1", "resourceclaims"),
}
# The type check cannot type a map of Quantity (a string or a number): it calls a
# container's resources.limits and .requests undefined, which evaluation reads as any map
# (the holders' GPU limit is admitted, the SR-IOV variant refused by that very rule).
UNTYPED_BY_THE_CHECKER = {"limits", "requests"}
# The issue's sample: each must be refused by the policy itself, not before it.
REQUIRED_SAMPLE = (
    "env secretKeyRef",
    "envFrom secretRef",
    "nodeName",
    "readiness probe exec",
    "hostAliases",
    "another ServiceAccount",
    "privileged",
)
# Variants the API server refuses before validating admission runs (its own validation of
# the object): they never reach the policy. The part of its error that says why.
REFUSED_BEFORE_THE_POLICY = {
    "ephemeral container at creation": "spec.ephemeralContainers: Forbidden: cannot be set",
    "Windows hostProcess": "hostNetwork must be true if pod contains any hostProcess",
}
REFUSED_BEFORE_THE_POLICY_CLAIMS = {
    "admin access": "requires the `resource.kubernetes.io/admin-access: true` label",
}
# Variants another validation of the policy refuses first than cel-python's first for the
# object as sent: the API server reports only the first that fails, and sees the object
# after defaulting and mutating admission. Case to that validation's words.
# The ServiceAccount admission plugin mounts the token (a projected volume) into a pod
# that does not turn automounting off, before validation: the container is not bare.
FIRST_REFUSED_BY_ANOTHER_RULE = {
    "token automount on": "a holder's container is bare",
    "token automount unset": "a holder's container is bare",
}


@dataclass(frozen=True)
class Answer:
    """What the API server answered a create: its HTTP status and message."""

    status: int
    message: str

    def refused_by(self, policy: str) -> str | None:
        """The denying validation's message, if `policy` refused the request."""
        said = f"ValidatingAdmissionPolicy '{policy}' with binding '{policy}' denied request: "
        if self.status != 403 or said not in self.message:
            return None
        return self.message.split(said, 1)[1]


@dataclass
class AsAgent:
    """The API as the agent's ServiceAccount (the admin impersonating it), and cel-python's
    verdict on the same request under the policies as the API server holds them."""

    user: str
    core: client.CoreV1Api
    resource: client.ResourceV1Api
    policies: dict[str, Obj]

    def celpy_denials(self, obj: Obj) -> list[str]:
        """What cel-python refuses `obj` for, sent as it is (no defaulting, no plugins)."""
        group, version, plural = RESOURCES[obj["kind"]]
        policy = self.policies[POD_POLICY if obj["kind"] == "Pod" else CLAIM_POLICY]
        review = admission_request("CREATE", self.user, obj, resource=(group, version, plural))
        return denials(policy, review, resource=plural)

    def celpy_update_denials(self, new: Obj, old: Obj) -> list[str]:
        """What cel-python refuses the change of pod `old` into `new` for."""
        review = admission_request("UPDATE", self.user, new, old)
        return denials(self.policies[POD_POLICY], review)

    def create(self, obj: Obj) -> Answer:
        namespace = obj["metadata"]["namespace"]
        try:
            if obj["kind"] == "Pod":
                self.core.create_namespaced_pod(namespace, obj, _preload_content=False)
            else:
                self.resource.create_namespaced_resource_claim(
                    namespace, obj, _preload_content=False
                )
        except ApiException as error:
            return Answer(error.status, json.loads(error.body or "{}").get("message", ""))
        return Answer(201, "")

    def patch(self, pod: Obj, patch: Obj) -> Answer:
        """A JSON merge patch of `pod`, sent as the agent's hand-over sends its own."""
        name, namespace = pod["metadata"]["name"], pod["metadata"]["namespace"]
        try:
            self.core.patch_namespaced_pod(
                name, namespace, patch, _content_type="application/merge-patch+json",
                _preload_content=False,
            )  # fmt: skip
        except ApiException as error:
            return Answer(error.status, json.loads(error.body or "{}").get("message", ""))
        return Answer(200, "")

    def delete(self, obj: Obj) -> Answer:
        name, namespace = obj["metadata"]["name"], obj["metadata"]["namespace"]
        try:
            if obj["kind"] == "Pod":
                self.core.delete_namespaced_pod(
                    name, namespace, grace_period_seconds=0, _preload_content=False
                )
            else:
                self.resource.delete_namespaced_resource_claim(
                    name, namespace, _preload_content=False
                )
        except ApiException as error:
            return Answer(error.status, json.loads(error.body or "{}").get("message", ""))
        return Answer(200, "")


@pytest.fixture(scope="module")
def release(node: Node, hotmount: flows.Release) -> flows.Release:
    if node.stack.minor < 30:
        pytest.skip(f"Kubernetes 1.{node.stack.minor} serves no ValidatingAdmissionPolicy")
    return hotmount


@pytest.fixture(scope="module")
def daemonset(node: Node, release: flows.Release) -> Obj:
    found = node.kubectl("get", "daemonset", flows.RELEASE, "-n", flows.NAMESPACE, "-o", "json")
    return dict(json.loads(found.stdout))


@pytest.fixture(scope="module")
def as_agent(node: Node, daemonset: Obj) -> Iterator[AsAgent]:
    account = daemonset["spec"]["template"]["spec"]["serviceAccountName"]
    user = f"system:serviceaccount:{flows.NAMESPACE}:{account}"
    policies = {
        name: json.loads(
            node.kubectl("get", "validatingadmissionpolicy", name, "-o", "json").stdout
        )
        for name in (POD_POLICY, CLAIM_POLICY)
    }
    api = config.new_client_from_config(config_file=str(node.kubeconfigs["admin"]))
    api.set_default_header("Impersonate-User", user)
    try:
        yield AsAgent(user, client.CoreV1Api(api), client.ResourceV1Api(api), policies)
    finally:
        api.close()


@pytest.fixture(scope="module")
def target(node: Node, release: flows.Release) -> Iterator[PodInfo]:
    """A running pod in `default`: the owner of every object sent here."""
    with flows.running_pod(node, flows.quick_pod_manifest(flows.new_name("vap-target"))) as name:
        pod = flows.get_pod(node, name)
        assert pod is not None
        yield PodInfo(
            namespace="default", name=name, uid=pod["metadata"]["uid"],
            node_name=pod["spec"]["nodeName"], phase="Running", containers=[],
        )  # fmt: skip


@pytest.fixture(scope="module")
def agents(node: Node, daemonset: Obj, target: PodInfo) -> Any:
    """A fresh set of the agent's objects for `target`, with the release's flags (blockers
    owned by the node's agent pod, in its namespace)."""
    argv = agent_argv(daemonset)
    selector = "app.kubernetes.io/name=gpu-hotmount"
    found = node.kubectl("get", "pods", "-n", flows.NAMESPACE, "-l", selector, "-o", "json")
    agent_pod = json.loads(found.stdout)["items"][0]
    agent = replace(
        target,
        namespace=flows.NAMESPACE,
        name=agent_pod["metadata"]["name"],
        uid=agent_pod["metadata"]["uid"],
    )
    return lambda: agents_objects(argv, target, agent)


@pytest.fixture(scope="module")
def named_by_variants(node: Node, agents: Any) -> Iterator[None]:
    """The ServiceAccounts and RuntimeClasses the variants name exist, as in a cluster an
    attacker picks them from: else the ServiceAccount and RuntimeClass admission plugins
    refuse the pod before the policy is asked."""
    accounts, runtimes = set(), set()
    for change, _ in HOSTILE.values():
        pod = agents()[0]["count holder"]
        change(pod)
        spec = pod["spec"]
        accounts |= {spec.get("serviceAccountName"), spec.get("serviceAccount")} - {None, "default"}
        runtimes |= {spec.get("runtimeClassName")} - {None}
    made = [("serviceaccount", a, "default") for a in accounts]
    for name in sorted(accounts):
        node.kubectl("create", "serviceaccount", name, "-n", "default")
    for name in sorted(runtimes):
        node.apply({"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass",
                    "metadata": {"name": name}, "handler": name})  # fmt: skip
    try:
        yield
    finally:
        for kind, name, namespace in made:
            node.kubectl("delete", kind, name, "-n", namespace, "--ignore-not-found")
        for name in runtimes:
            node.kubectl("delete", "runtimeclass", name, "--ignore-not-found")


def _remove(node: Node, obj: Obj) -> None:
    """An object that was admitted, gone at once (as the admin)."""
    kind = "pod" if obj["kind"] == "Pod" else "resourceclaim"
    node.kubectl("delete", kind, obj["metadata"]["name"], "-n", obj["metadata"]["namespace"],
                 "--ignore-not-found", "--grace-period=0", "--force", "--wait=false")  # fmt: skip


# ---- the policies are the chart's, and the API server type-checked them --------------


def test_the_chart_installed_both_policies_and_their_bindings(
    node: Node, release: flows.Release
) -> None:
    def helm_managed(kind: str) -> dict[str, Obj]:
        found = json.loads(node.kubectl("get", kind, "-o", "json").stdout)["items"]
        return {
            o["metadata"]["name"]: o
            for o in found
            if o["metadata"].get("annotations", {}).get("meta.helm.sh/release-name")
            == flows.RELEASE
        }

    policies = helm_managed("validatingadmissionpolicies")
    bindings = helm_managed("validatingadmissionpolicybindings")
    assert set(policies) == set(bindings) == {POD_POLICY, CLAIM_POLICY}
    for name, binding in bindings.items():
        assert binding["spec"]["policyName"] == name
        assert binding["spec"]["validationActions"] == ["Deny"]
    for policy in policies.values():
        assert policy["spec"]["failurePolicy"] == "Fail"


def _type_check_warnings(node: Node, policy: Obj, name: str) -> list[Obj]:
    """kube-controller-manager's type check of `policy`'s expressions against the OpenAPI
    schema, as an unbound copy named `name` (enforcing nothing). It skips a rule of
    apiVersions "*", as the chart's are (any version of the resource): the copy names v1."""
    copied = {"apiVersion": policy["apiVersion"], "kind": policy["kind"],
              "metadata": {"name": name}, "spec": copy.deepcopy(policy["spec"])}  # fmt: skip
    for rule in copied["spec"]["matchConstraints"]["resourceRules"]:
        rule["apiVersions"] = ["v1"]
    node.apply(copied)
    try:

        def checked() -> Obj | None:
            found = node.kubectl("get", "validatingadmissionpolicy", name, "-o", "json").stdout
            status = json.loads(found).get("status", {})
            return status if status.get("observedGeneration") else None

        status = flows.wait_for(f"{name} is type-checked", checked, 60)
        return list(status.get("typeChecking", {}).get("expressionWarnings", []))
    finally:
        node.kubectl("delete", "validatingadmissionpolicy", name, "--ignore-not-found")


def _undefined_fields(warnings: list[Obj]) -> list[str]:
    """The fields the type check calls undefined; it may report nothing else."""
    found = []
    for warning in warnings:
        text = warning["warning"]
        fields = re.findall(r"undefined field '([^']+)'", text)
        assert len(fields) == text.count("ERROR:"), text
        found += fields
    return found


def test_the_api_server_type_checks_every_expression(node: Node, as_agent: AsAgent) -> None:
    for name, policy in as_agent.policies.items():
        undefined = _undefined_fields(_type_check_warnings(node, policy, f"typecheck-{name}"))
        assert set(undefined) <= UNTYPED_BY_THE_CHECKER, (name, undefined)
    # not vacuous: a misspelt field is reported
    misspelt = copy.deepcopy(as_agent.policies[POD_POLICY])
    misspelt["spec"]["validations"][0]["expression"] += " && object.spec.hostPid != true"
    assert "hostPid" in _undefined_fields(_type_check_warnings(node, misspelt, "typecheck-x"))


# ---- the agent's own objects are admitted ----------------------------------------------


def test_a_mount_by_name_makes_its_blockers_and_pin_under_the_policy(
    node: Node, release: flows.Release, target: PodInfo
) -> None:
    """The agent itself, as it runs: a GPU by name holds the other free GPUs with blockers
    in its own namespace and keeps a pin in the pod's."""
    flows.nvcli_ok(node, "alice", "mount", "--name", target.name, "--mount", "0")
    try:
        pin = flows.the_pin(node, target.name)
        assert pin["metadata"]["ownerReferences"][0]["uid"] == target.uid
        assert flows.mounted_uuids(node, "alice", target.name) == [NVML_GPUS[0].uuid]
    finally:
        flows.nvcli_ok(node, "alice", "unmount", "--name", target.name, "--all")


def test_every_object_the_agent_makes_is_admitted_and_may_be_deleted(
    node: Node, as_agent: AsAgent, agents: Any
) -> None:
    """Count holder, blocker, pin and DRA pin, the GPU and MIG claims: created as the agent
    and deleted as the agent (a DRA pin's claim first, as the agent makes them). The
    blocker is of the chart's blockers' class, which the Priority admission plugin accepts
    only because that class's preemptionPolicy is the blocker's Never."""
    pods, claims = agents()
    ordered = [claims["GPU claim"], claims["MIG claim"], *pods.values()]
    created: list[Obj] = []
    try:
        for obj in ordered:
            assert as_agent.celpy_denials(obj) == [], obj["metadata"]["name"]
            answer = as_agent.create(obj)
            assert answer.status == 201, (obj["metadata"]["name"], answer)
            created.append(obj)
        # the chart's blockers' class gave the blocker its preemptionPolicy (issue 40, 8)
        blocker = pods["blocker"]["metadata"]
        held = flows.get_pod(node, blocker["name"], blocker["namespace"])
        assert held is not None and held["spec"]["preemptionPolicy"] == "Never", held
        for obj in reversed(created):
            answer = as_agent.delete(obj)
            assert answer.status in (200, 202, 404), (obj["metadata"]["name"], answer)
    finally:
        for obj in created:
            _remove(node, obj)


def test_the_agent_may_not_change_a_holders_spec_or_delete_another_pod(
    node: Node, as_agent: AsAgent, agents: Any, target: PodInfo
) -> None:
    holder = agents()[0]["pin"]
    assert as_agent.create(holder).status == 201
    try:
        name = holder["metadata"]["name"]
        try:
            as_agent.core.patch_namespaced_pod(
                name, "default", {"spec": {"activeDeadlineSeconds": 5}}
            )
            patched = Answer(200, "")
        except ApiException as error:
            patched = Answer(error.status, json.loads(error.body or "{}").get("message", ""))
        assert "labels and owner reference only" in (patched.refused_by(POD_POLICY) or ""), patched
    finally:
        _remove(node, holder)
    tenant = {"kind": "Pod", "metadata": {"name": target.name, "namespace": "default"}}
    refused = as_agent.delete(tenant).refused_by(POD_POLICY) or ""
    assert "only create, change or delete holder pods" in refused
    assert flows.get_pod(node, target.name) is not None


# ---- hostile variants, refused by the API server -----------------------------------------


def _expect_refused(
    node: Node, as_agent: AsAgent, case: str, obj: Obj, reason: str, before: dict[str, str]
) -> None:
    """`obj` is refused by the API server: by the policy, for `reason` and as cel-python
    refuses it, unless `before` names the API server's own reason to refuse it first."""
    policy = POD_POLICY if obj["kind"] == "Pod" else CLAIM_POLICY
    celpy = as_agent.celpy_denials(obj)
    answer = as_agent.create(obj)
    if answer.status == 201:
        _remove(node, obj)
    if case in before:
        assert answer.status != 201 and answer.refused_by(policy) is None, (case, answer)
        assert before[case] in answer.message, (case, answer)
        assert celpy, f"{case}: cel-python admits it"
        return
    assert answer.status != 201, f"{case} was admitted"
    denied = answer.refused_by(policy)
    assert denied is not None, f"{case}: not refused by the policy: {answer}"
    if case in FIRST_REFUSED_BY_ANOTHER_RULE:
        assert FIRST_REFUSED_BY_ANOTHER_RULE[case] in denied, (case, denied)
        assert any(reason in m for m in celpy), (case, celpy)
    else:
        assert reason in denied, (case, denied)
        assert celpy[:1] == [denied], (case, denied, celpy)  # cel-python's first, too


def test_the_issues_sample_is_refused_by_the_policy_itself() -> None:
    exceptions = {*REFUSED_BEFORE_THE_POLICY, *FIRST_REFUSED_BY_ANOTHER_RULE}
    assert set(REQUIRED_SAMPLE) <= set(HOSTILE) - exceptions
    assert "UPDATE makes a non-holder a holder" in HOSTILE_UPDATES  # issue 40's attack


@pytest.mark.parametrize("case", sorted(HOSTILE), ids=sorted(HOSTILE))
def test_a_hostile_pod_from_the_agent_is_refused_by_the_api_server(
    case: str, node: Node, as_agent: AsAgent, agents: Any, named_by_variants: None
) -> None:
    change, reason = HOSTILE[case]
    pod = copy.deepcopy(agents()[0]["count holder"])
    change(pod)
    _expect_refused(node, as_agent, case, pod, reason, REFUSED_BEFORE_THE_POLICY)


@pytest.mark.parametrize("case", sorted(HOSTILE_BLOCKERS), ids=sorted(HOSTILE_BLOCKERS))
def test_a_hostile_blocker_from_the_agent_is_refused_by_the_api_server(
    case: str, node: Node, as_agent: AsAgent, agents: Any
) -> None:
    """The Priority admission plugin gives the blocker its class's preemptionPolicy (none:
    PreemptLowerPriority) before the policy refuses it; the agent's own blocker, of the
    chart's class of Never, is admitted above."""
    change, reason = HOSTILE_BLOCKERS[case]
    blocker = copy.deepcopy(agents()[0]["blocker"])
    change(blocker)
    _expect_refused(node, as_agent, case, blocker, reason, {})


@pytest.mark.parametrize("case", sorted(HOSTILE_CLAIMS), ids=sorted(HOSTILE_CLAIMS))
def test_a_hostile_claim_from_the_agent_is_refused_by_the_api_server(
    case: str, node: Node, as_agent: AsAgent, agents: Any
) -> None:
    change, reason = HOSTILE_CLAIMS[case]
    claim = agents()[1]["GPU claim"]
    change(claim)
    _expect_refused(node, as_agent, case, claim, reason, REFUSED_BEFORE_THE_POLICY_CLAIMS)


# ---- hostile changes (UPDATE), refused by the API server ------------------------------------


def _made_by_its_owner(node: Node, pod: Obj) -> Obj:
    """`pod` created as the admin (under a new name that keeps its prefix: the table's
    names recur), as its owner would make it; the pod as the API server holds it."""
    metadata = pod["metadata"]
    metadata["name"] = flows.new_name(metadata["name"])
    node.kubectl("create", "-f", "-", stdin=json.dumps(pod))
    stored = flows.get_pod(node, metadata["name"], metadata["namespace"])
    assert stored is not None, metadata["name"]
    return stored


def test_the_agents_hand_over_is_admitted_by_the_api_server(
    node: Node, as_agent: AsAgent, agents: Any
) -> None:
    """Not vacuous: the change a move makes (agent/kube/client.py, hand_over) to the
    agent's own pin is admitted, so a refusal below is the change's doing. (Its new owner
    does not exist: the garbage collector may delete the pin at once, so it is not read
    back.)"""
    pin = agents()[0]["pin"]
    try:
        stored = _made_by_its_owner(node, pin)
        assert as_agent.celpy_update_denials(merge_patch(stored, HAND_OVER), stored) == []
        answer = as_agent.patch(pin, HAND_OVER)
        assert answer.status == 200, answer
    finally:
        _remove(node, pin)


@pytest.mark.parametrize("case", sorted(HOSTILE_UPDATES), ids=sorted(HOSTILE_UPDATES))
def test_a_hostile_change_from_the_agent_is_refused_by_the_api_server(
    case: str, node: Node, as_agent: AsAgent, agents: Any
) -> None:
    """Issue 40: the pod exists, as its owner made it; the agent's account sends the
    table's merge patch; the policy refuses it, for the table's reason and first as
    cel-python does for the pod as the API server holds it, and the pod is unchanged."""
    hostile = HOSTILE_UPDATES[case]
    pod = hostile.old(agents()[0])
    try:
        stored = _made_by_its_owner(node, pod)
        celpy = as_agent.celpy_update_denials(merge_patch(stored, hostile.patch), stored)
        answer = as_agent.patch(pod, hostile.patch)
        assert answer.status != 200, f"{case} was admitted"
        denied = answer.refused_by(POD_POLICY)
        assert denied is not None, f"{case}: not refused by the policy: {answer}"
        assert hostile.reason in denied, (case, denied)
        assert celpy[:1] == [denied], (case, denied, celpy)
        after = flows.get_pod(node, pod["metadata"]["name"], pod["metadata"]["namespace"])
        assert after is not None and after["metadata"]["labels"] == stored["metadata"]["labels"]
    finally:
        _remove(node, pod)
