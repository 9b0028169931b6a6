"""The objects the agent makes, and hostile variants of them, for the admission policies.

One table, two evaluators: tests/deploy/test_admission_policy.py runs the policies' CEL in
cel-python against these, and tests/k8s/test_22_admission_policy.py sends them to a real
API server as the agent's ServiceAccount. Each hostile change is applied to an object the
agent's own code built and names what the policy must refuse it for (a part of the
denying validation's message). HOSTILE_BLOCKERS change the agent's blocker rather than its
count holder. HOSTILE_UPDATES are changes (UPDATE) rather than creations: a JSON merge
patch the agent's account sends to a pod that exists, as its owner made it.
"""

from __future__ import annotations

import copy
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from agent.books.dra import with_claim
from agent.books.holders import HolderPods, Role
from agent.books.holders import holder_manifest as agent_holder_manifest
from agent.books.pins import pin_claim_manifest
from agent.config import load_settings
from agent.kube.client import PodInfo

Obj = dict[str, Any]
Change = Callable[[Obj], None]
GPU_UUID = "GPU-8f6f9c2e-3b1d-4c1e-9a51-0c4b1e2d3f4a"
MIG_UUID = "MIG-5d3c1a2b-0e9f-4a8b-b7c6-d5e4f3a2b1c0"
UUID_SELECTOR = f'device.attributes["gpu.nvidia.com"].uuid == "{GPU_UUID}"'


def agent_pod_for(target: PodInfo, namespace: str = "gpu-hotmount") -> PodInfo:
    """A node's agent pod: it owns the blockers, which live in its own namespace."""
    return replace(target, namespace=namespace, name="gpu-hotmount-x7k2p", uid=str(uuid.uuid4()))


def agents_objects(
    argv: list[str], target: PodInfo, agent: PodInfo | None = None
) -> tuple[dict[str, Obj], dict[str, Obj]]:
    """Every pod and ResourceClaim the agent makes for `target`, built by its own code
    (names too, new ones each call): count holders, blockers (owned by the `agent` pod,
    in its namespace) and pins by device plugin, and pins with their claims by DRA."""
    settings = load_settings(argv)

    def named(role: Role) -> str:
        return HolderPods.new_name(target, role)

    holder = agent_holder_manifest(settings, target, named(Role.COUNT), 2)
    owner = agent or agent_pod_for(target)
    blocker = agent_holder_manifest(settings, owner, named(Role.BLOCKER), 1, Role.BLOCKER)
    pin = agent_holder_manifest(settings, target, named(Role.PIN), 1, Role.PIN, GPU_UUID)
    name = named(Role.PIN)
    dra_pin = with_claim(agent_holder_manifest(settings, target, name, 1, Role.PIN, GPU_UUID), name)
    pods = {"count holder": holder, "blocker": blocker, "pin": pin, "DRA pin": dra_pin}
    claims = {
        "GPU claim": pin_claim_manifest(target, name, GPU_UUID, mig=False),
        "MIG claim": pin_claim_manifest(target, named(Role.PIN), MIG_UUID, mig=True),
    }
    return pods, claims


# -- hostile pods ---------------------------------------------------------------------------


def _set(path: str, value: Any) -> Change:
    def change(pod: Obj) -> None:
        *parents, last = path.split(".")
        node: Any = pod
        for part in parents:
            node = node[int(part)] if part.isdigit() else node.setdefault(part, {})
        node[last] = value

    return change


def _drop(path: str) -> Change:
    def change(pod: Obj) -> None:
        *parents, last = path.split(".")
        node: Any = pod
        for part in parents:
            node = node[int(part)] if part.isdigit() else node[part]
        del node[last]

    return change


def _owner(**changes: Any) -> Change:
    def change(pod: Obj) -> None:
        pod["metadata"]["ownerReferences"][0].update(changes)

    return change


def _unmanaged(pod: Obj) -> None:
    pod["metadata"]["labels"]["app.kubernetes.io/managed-by"] = "someone-else"


def _env_from(source: Obj) -> Obj:
    return {"name": "LEAK", "valueFrom": source}


def _mounted_volume(pod: Obj) -> None:
    """A mount needs its volume, or the API server's own validation refuses the pod."""
    pod["spec"]["volumes"] = [{"name": "x", "emptyDir": {}}]
    pod["spec"]["containers"][0]["volumeMounts"] = [{"name": "x", "mountPath": "/x"}]


def _unmasked_proc(pod: Obj) -> None:
    """The API server allows an unmasked /proc only in a user namespace (hostUsers false)."""
    pod["spec"]["hostUsers"] = False
    pod["spec"]["containers"][0]["securityContext"] = {"procMount": "Unmasked"}


def _second_owner(pod: Obj) -> None:
    refs = pod["metadata"]["ownerReferences"]
    refs.append({**refs[0], "name": "other", "uid": str(uuid.uuid4())})


HOSTILE: dict[str, tuple[Change, str]] = {
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
    # Issue 18: a Secret named by a pod bound to a node (nodeName) is the node's to read.
    "env secretKeyRef": (
        _set("spec.containers.0.env", [_env_from({"secretKeyRef": {"name": "db", "key": "pw"}})]),
        "environment is literal",
    ),
    "env configMapKeyRef": (
        _set("spec.containers.0.env", [_env_from({"configMapKeyRef": {"name": "c", "key": "k"}})]),
        "environment is literal",
    ),
    "env fieldRef": (
        _set("spec.containers.0.env", [_env_from({"fieldRef": {"fieldPath": "metadata.name"}})]),
        "environment is literal",
    ),
    "env resourceFieldRef": (
        _set(
            "spec.containers.0.env", [_env_from({"resourceFieldRef": {"resource": "limits.cpu"}})]
        ),
        "environment is literal",
    ),
    "env NVIDIA_VISIBLE_DEVICES=all": (
        _set("spec.containers.0.env", [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]),
        "environment is literal",
    ),
    "envFrom secretRef": (
        _set("spec.containers.0.envFrom", [{"secretRef": {"name": "db"}}]),
        "environment is literal",
    ),
    "envFrom configMapRef": (
        _set("spec.containers.0.envFrom", [{"configMapRef": {"name": "c"}}]),
        "environment is literal",
    ),
    "imagePullSecrets": (_set("spec.imagePullSecrets", [{"name": "db"}]), "imagePullSecrets"),
    "nodeName": (_set("spec.nodeName", "gpu-node-1"), "no nodeName"),
    "nodeSelector": (_set("spec.nodeSelector", {"kubernetes.io/os": "linux"}), "default scheduler"),
    "another scheduler": (_set("spec.schedulerName", "mine"), "default scheduler"),
    "pod anti-affinity": (
        _set(
            "spec.affinity.podAntiAffinity", {"requiredDuringSchedulingIgnoredDuringExecution": []}
        ),
        "default scheduler",
    ),
    "activeDeadlineSeconds": (_set("spec.activeDeadlineSeconds", 1), "runs until deleted"),
    "lifecycle postStart httpGet": (
        _set(
            "spec.containers.0.lifecycle",
            {"postStart": {"httpGet": {"host": "10.0.0.1", "port": 80}}},
        ),
        "lifecycle",
    ),
    "lifecycle preStop exec": (
        _set("spec.containers.0.lifecycle", {"preStop": {"exec": {"command": ["sh"]}}}),
        "lifecycle",
    ),
    "liveness probe httpGet.host (SSRF from the kubelet)": (
        _set(
            "spec.containers.0.livenessProbe",
            {"httpGet": {"host": "169.254.169.254", "path": "/latest/meta-data", "port": 80}},
        ),
        "probes",
    ),
    "readiness probe exec": (
        _set("spec.containers.0.readinessProbe", {"exec": {"command": ["cat", "/etc/shadow"]}}),
        "probes",
    ),
    "startup probe tcpSocket.host": (
        _set("spec.containers.0.startupProbe", {"tcpSocket": {"host": "10.0.0.1", "port": 6443}}),
        "probes",
    ),
    "ephemeral container at creation": (
        _set("spec.ephemeralContainers", [{"name": "e", "image": "registry.k8s.io/pause:3.9"}]),
        "no init or ephemeral",
    ),
    "sysctls": (
        _set("spec.securityContext.sysctls", [{"name": "net.ipv4.ip_forward", "value": "1"}]),
        "sysctls",
    ),
    "hostAliases": (
        _set("spec.hostAliases", [{"ip": "10.0.0.1", "hostnames": ["registry.internal"]}]),
        "hostAliases",
    ),
    "dnsConfig": (_set("spec.dnsConfig", {"nameservers": ["10.0.0.53"]}), "dnsConfig"),
    "dnsPolicy Default (the node's resolver)": (_set("spec.dnsPolicy", "Default"), "dnsPolicy"),
    "hostname": (_set("spec.hostname", "db"), "hostname"),
    "an unlisted priorityClassName": (
        _set("spec.priorityClassName", "system-node-critical"),
        "priorityClassName",
    ),
    "an unconfigured runtimeClassName": (
        _set("spec.runtimeClassName", "runc-unconfined"),
        "runtimeClassName",
    ),
    "another resource (an SR-IOV VF)": (
        lambda pod: pod["spec"]["containers"][0]["resources"]["limits"].update(
            {"intel.com/sriov": "1"}
        ),
        "cpu, memory and the GPU resource only",
    ),
    "pod-level resources": (_set("spec.resources", {"limits": {"cpu": "1"}}), "cpu, memory"),
    "another pod's ResourceClaim": (
        _set("spec.resourceClaims", [{"name": "gpu", "resourceClaimName": "someone-elses"}]),
        "ResourceClaim of its own name",
    ),
    "a ResourceClaimTemplate": (
        _set("spec.resourceClaims", [{"name": "gpu", "resourceClaimTemplateName": "t"}]),
        "ResourceClaim of its own name",
    ),
    "a runtime annotation": (
        _set("metadata.annotations", {"io.kubernetes.cri-o.Devices": "/dev/sda"}),
        "metadata is the agent's",
    ),
    "a Multus network annotation": (
        _set("metadata.annotations", {"k8s.v1.cni.cncf.io/networks": "kube-system/host"}),
        "metadata is the agent's",
    ),
    "another label": (_set("metadata.labels.app", "db"), "metadata is the agent's"),
    "a name that is no holder's": (_set("metadata.name", "db-0"), "metadata is the agent's"),
    "a finalizer": (_set("metadata.finalizers", ["example.com/keep"]), "metadata is the agent's"),
    "volumeMounts": (_mounted_volume, "bare"),
    "tty": (_set("spec.containers.0.tty", True), "bare"),
    "a sidecar restartPolicy": (_set("spec.containers.0.restartPolicy", "Always"), "bare"),
    "workingDir": (_set("spec.containers.0.workingDir", "/"), "bare"),
    "a port without hostPort": (
        _set("spec.containers.0.ports", [{"containerPort": 80}]),
        "no ports",
    ),
    "shareProcessNamespace": (_set("spec.shareProcessNamespace", True), "host namespace"),
    "serviceAccount (the old alias)": (
        _set("spec.serviceAccount", "admin"),
        "default ServiceAccount",
    ),
    "procMount Unmasked": (_unmasked_proc, "loosens no confinement"),
    "seccomp Unconfined": (
        _set("spec.containers.0.securityContext", {"seccompProfile": {"type": "Unconfined"}}),
        "loosens no confinement",
    ),
    "AppArmor Unconfined": (
        _set("spec.containers.0.securityContext", {"appArmorProfile": {"type": "Unconfined"}}),
        "loosens no confinement",
    ),
    "SELinux spc_t": (
        _set("spec.containers.0.securityContext", {"seLinuxOptions": {"type": "spc_t"}}),
        "loosens no confinement",
    ),
    "Windows hostProcess": (
        _set("spec.containers.0.securityContext", {"windowsOptions": {"hostProcess": True}}),
        "loosens no confinement",
    ),
    "pod seccomp Unconfined": (
        _set("spec.securityContext.seccompProfile", {"type": "Unconfined"}),
        "loosens no confinement",
    ),
}


# -- hostile blockers ------------------------------------------------------------------------


def _without_class(pod: Obj) -> None:
    """No class, so none of preemptionPolicy Never: the Priority admission plugin gives it
    PreemptLowerPriority (or the cluster's globalDefault class's)."""
    pod["spec"].pop("priorityClassName", None)
    pod["spec"].pop("preemptionPolicy", None)


# Applied to the agent's blocker as it sends it: the Priority admission plugin then gives
# it its class's preemptionPolicy before the policy sees it. A blocker counts against no
# quota (it lives in the agent's namespace): one that may preempt could evict any pod of
# lower priority on the node.
HOSTILE_BLOCKERS: dict[str, tuple[Change, str]] = {
    "a blocker that may preempt (no class of preemptionPolicy Never)": (
        _without_class,
        "a blocker preempts no pod",
    ),
}


# -- hostile ResourceClaims (DRA) ---------------------------------------------------------


def _exactly(**changes: Any) -> Change:
    def change(claim: Obj) -> None:
        claim["spec"]["devices"]["requests"][0]["exactly"].update(changes)

    return change


def _all_devices(claim: Obj) -> None:
    """All of the class's devices (a count with it is invalid)."""
    exactly = claim["spec"]["devices"]["requests"][0]["exactly"]
    del exactly["count"]
    exactly["allocationMode"] = "All"


def _first_available(claim: Obj) -> None:
    """A list of alternatives instead of `exactly` (both at once is invalid)."""
    alternatives = [{"name": "a", "deviceClassName": "gpu.nvidia.com"}]
    claim["spec"]["devices"]["requests"][0] = {"name": "gpu", "firstAvailable": alternatives}


def _second_request(claim: Obj) -> None:
    requests = claim["spec"]["devices"]["requests"]
    requests.append({**requests[0], "name": "more"})


HOSTILE_CLAIMS: dict[str, tuple[Change, str]] = {
    "admin access": (_exactly(adminAccess=True), "no admin access"),
    "another device class": (_exactly(deviceClassName="sriov.example.com"), "NVIDIA's classes"),
    "all devices": (_all_devices, "exactly one"),
    "two devices": (_exactly(count=2), "exactly one"),
    "any device": (_exactly(selectors=[{"cel": {"expression": "true"}}]), "by its UUID alone"),
    "a UUID or anything": (
        _exactly(selectors=[{"cel": {"expression": f"{UUID_SELECTOR} || true"}}]),
        "by its UUID alone",
    ),
    "no selector": (_exactly(selectors=[]), "by its UUID alone"),
    "a taint toleration": (_exactly(tolerations=[{"operator": "Exists"}]), "tolerations"),
    "capacity": (_exactly(capacity={"requests": {"memory": "1Gi"}}), "capacity"),
    "a second request": (_second_request, "exactly one"),
    "first available": (_first_available, "exactly one"),
    "driver configuration": (
        _set("spec.devices.config", [{"opaque": {"driver": "gpu.nvidia.com", "parameters": {}}}]),
        "configuration",
    ),
    "constraints": (
        _set("spec.devices.constraints", [{"matchAttribute": "gpu.nvidia.com/productName"}]),
        "constraints",
    ),
    "not a pin": (
        lambda c: c["metadata"]["labels"].update({"hotmount.io/role": "count"}),
        "only create or delete",
    ),
    "not managed by gpu-hotmount": (
        _set("metadata.labels", {"hotmount.io/holder-for": "notebook", "hotmount.io/role": "pin"}),
        "named hotmount-pin-",
    ),
    "an annotation": (_set("metadata.annotations", {"x": "y"}), "no annotations"),
    "another name": (_set("metadata.name", "db-claim"), "named hotmount-pin-"),
    "owned by another pod": (_owner(name="victim"), "owned by the pod"),
    "controller owner": (_owner(controller=True), "owned by the pod"),
}


# -- hostile changes (UPDATE) of pods -----------------------------------------------------


def merge_patch(target: Any, patch: Any) -> Any:
    """`patch` applied to `target` as the API server applies a JSON merge patch (RFC 7386):
    maps merge key by key, a null removes the key, anything else (a list) replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    merged = copy.deepcopy(target) if isinstance(target, dict) else {}
    for name, value in patch.items():
        if value is None:
            merged.pop(name, None)
        else:
            merged[name] = merge_patch(merged.get(name), value)
    return merged


def _pod_owner(name: str) -> Obj:
    return {"apiVersion": "v1", "kind": "Pod", "name": name, "uid": str(uuid.uuid4()),
            "controller": False, "blockOwnerDeletion": False}  # fmt: skip


# The agent's one change (agent/kube/client.py, hand_over): a pin handed over to another
# pod on a move, its holder-for label and its one owner reference in one merge patch.
HAND_OVER: Obj = {
    "metadata": {
        "labels": {"hotmount.io/holder-for": "other-notebook"},
        "ownerReferences": [_pod_owner("other-notebook")],
    }
}


@dataclass(frozen=True)
class HostileUpdate:
    """A merge patch from the agent's account to a pod that exists: one the agent made
    (`base`, a key of agents_objects' pods), or one its owner made of it (`before`
    changes it, as a tenant may shape and label a pod of its own). `reason`: what the
    policy must refuse the change for."""

    patch: Obj
    reason: str
    before: Change | None = None
    base: str = "pin"

    def old(self, pods: dict[str, Obj]) -> Obj:
        """The pod as its maker sent it, out of the agent's objects `pods`."""
        pod = copy.deepcopy(pods[self.base])
        if self.before is not None:
            self.before(pod)
        return pod


def _tenants_database(pod: Obj) -> None:
    """A tenant's own pod where the pin was (payments/postgres-0): not a holder at all."""
    metadata = pod["metadata"]
    metadata["name"] = "postgres-0"
    metadata["labels"] = {"app": "postgres"}
    del metadata["ownerReferences"]
    metadata.pop("annotations", None)


def _relabelled(labels: dict[str, str]) -> Change:
    """The pin with other values of these labels: a pod whose owner labelled it so (the
    labels of a tenant's pod are the tenant's to write)."""

    def change(pod: Obj) -> None:
        pod["metadata"]["labels"].update(labels)

    return change


_MAKES_NO_HOLDER = "never makes a holder of another pod"
_STAYS_A_PIN = "a pin stays a pin"
_HOLDER_LABELS = {"app.kubernetes.io/managed-by": "gpu-hotmount", "hotmount.io/holder-for": "ghost"}


def _labels(labels: dict[str, str | None]) -> Obj:
    """A merge patch of these labels (None removes one)."""
    return {"metadata": {"labels": labels}}


def _handed_to(owner: Obj) -> Obj:
    """HAND_OVER with another owner reference in place of the pod's."""
    return merge_patch(HAND_OVER, {"metadata": {"ownerReferences": [owner]}})


HOSTILE_UPDATES: dict[str, HostileUpdate] = {
    # Issue 40: the holder labels and an owner that does not exist (payments/postgres-0):
    # the garbage collector deletes the pod, or the agent's account does (by its labels,
    # a holder). Admitted before, as every rule read the new pod only.
    "UPDATE makes a non-holder a holder": HostileUpdate(
        {"metadata": {"labels": _HOLDER_LABELS, "ownerReferences": [_pod_owner("ghost")]}},
        _MAKES_NO_HOLDER,
        _tenants_database,
    ),
    "UPDATE makes a non-holder a pin, its own labels gone": HostileUpdate(
        merge_patch(
            _labels({"app": None, **_HOLDER_LABELS, "hotmount.io/role": "pin"}),
            {"metadata": {"ownerReferences": [_pod_owner("ghost")]}},
        ),
        _MAKES_NO_HOLDER,
        _tenants_database,
    ),
    "UPDATE hands over a pod named without the hotmount- prefix": HostileUpdate(
        HAND_OVER, _MAKES_NO_HOLDER, _set("metadata.name", "db-0")
    ),
    "UPDATE claims a pin-shaped pod of another manager": HostileUpdate(
        _labels({"app.kubernetes.io/managed-by": "gpu-hotmount"}),
        _MAKES_NO_HOLDER,
        _relabelled({"app.kubernetes.io/managed-by": "helm"}),
    ),
    # The agent hands over pins only (a GPU mounted by count does not move).
    "UPDATE hands over a count holder": HostileUpdate(
        HAND_OVER, _MAKES_NO_HOLDER, base="count holder"
    ),
    "UPDATE hands over a blocker": HostileUpdate(HAND_OVER, _MAKES_NO_HOLDER, base="blocker"),
    "UPDATE turns a pin into a count holder": HostileUpdate(
        _labels({"hotmount.io/role": "count"}), _STAYS_A_PIN
    ),
    "UPDATE turns a pin into a blocker": HostileUpdate(
        _labels({"hotmount.io/role": "blocker"}), _STAYS_A_PIN
    ),
    "UPDATE drops a pin's role": HostileUpdate(_labels({"hotmount.io/role": None}), _STAYS_A_PIN),
    # Another label can put the pin under a tenant's ReplicaSet (whose selector it then
    # matches, with no controller owner) or behind a Service.
    "UPDATE adds a label to a pin": HostileUpdate(_labels({"app": "postgres"}), _STAYS_A_PIN),
    "UPDATE hands a pin to a Deployment": HostileUpdate(
        _handed_to({**_pod_owner("other-notebook"), "apiVersion": "apps/v1", "kind": "Deployment"}),
        "exactly one owner reference",
    ),
    "UPDATE makes the pin's new owner its controller": HostileUpdate(
        _handed_to({**_pod_owner("other-notebook"), "controller": True}),
        "exactly one owner reference",
    ),
}
