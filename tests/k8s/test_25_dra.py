"""Flow 25: DRA for real (issue 31, item 1): the DRA example driver on the node.

The driver (tests/k8s/dradriver.py: `sigs.k8s.io/dra-example-driver` v0.4.0 built from
its Go module) publishes two GPUs as `gpu.example.com`, and the fake NVML shows the
agent the same two by UUID. The agent is configured for that driver by the chart's
`dra.*` values alone.

What is proven here, against the real scheduler, kubelet and containerd: a claim's pod
runs with what the driver's CDI spec injects; a pin is a claim the scheduler allocates
to exactly the pinned GPU, so ordinary DRA pods get the other one and wait while none
is free; the agent reads DRA allocations from PodResources and answers 409; a
ResourceQuota on the class's devices is charged by a pin and refuses the next with
exit 7; a pod asking `nvidia.com/gpu` through the DeviceClass's extended resource name
(KEP-5004) is in the same books.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from agent.podresources.client import PodResourcesClient
from tests.k8s import dradriver, flows
from tests.k8s.dradriver import CLASS, DRIVER, DraGpu
from tests.k8s.flows import ABSENT, EXIT_CONFLICT, EXIT_QUOTA, GRANTED
from tests.k8s.node.cluster import CDI_DIRS, NODE_NAME, Node

NVML_CONFIG = "gpus-dra.conf"
EXTENDED_RESOURCE = flows.GPU_RESOURCE  # nvidia.com/gpu, through the DeviceClass (KEP-5004)


@pytest.fixture(scope="module")
def dra(node: Node, gpus: flows.Gpus, hotmount: flows.Release) -> Iterator[list[DraGpu]]:
    """The driver running, its DeviceClass, the fake NVML showing its GPUs, and the agent
    configured for it; all undone afterwards (the package's other flows use the device
    plugin's GPUs)."""
    try:
        published = dradriver.start(node, EXTENDED_RESOURCE)
        dradriver.write_nvml(gpus.nvml_dir / NVML_CONFIG, [g.nvml() for g in published])
        hotmount.set_dra(dradriver.VALUES, NVML_CONFIG)
        yield published
    finally:
        hotmount.set_dra({}, "gpus.conf")
        dradriver.stop(node)


# ---- helpers ---------------------------------------------------------------------


def claim_manifest(name: str, namespace: str = "default") -> dict[str, Any]:
    """An ordinary tenant's claim: any one device of the class."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": CLASS}}]}},
    }


def claim_pod_manifest(name: str, namespace: str = "default") -> dict[str, Any]:
    """A pod using the claim of its own name."""
    manifest = flows.quick_pod_manifest(name, namespace)
    manifest["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimName": name}]
    manifest["spec"]["containers"][0]["resources"] = {"claims": [{"name": "gpu"}]}
    return manifest


@contextmanager
def ordinary_claim_pod(node: Node, namespace: str = "default") -> Iterator[str]:
    """An ordinary DRA pod and its claim, created (not waited for); both deleted after."""
    name = flows.new_name("dra-pod")
    node.apply([claim_manifest(name, namespace), claim_pod_manifest(name, namespace)])
    try:
        yield name
    finally:
        flows.delete_pod(node, name, namespace)
        node.kubectl("delete", "resourceclaim", name, "-n", namespace, "--ignore-not-found",
                     "--wait=true", "--timeout=60s", check=False, timeout=90)  # fmt: skip


def allocated(node: Node, claim: str, namespace: str = "default") -> list[str]:
    """The devices of the driver the scheduler allocated to a claim ([] before)."""
    found = node.kubectl("get", "resourceclaim", claim, "-n", namespace, "-o", "json").stdout
    status = json.loads(found).get("status") or {}
    results = ((status.get("allocation") or {}).get("devices") or {}).get("results") or []
    return [r["device"] for r in results if r["driver"] == DRIVER]


def dra_pod_resources() -> dict[tuple[str, str], list[str]]:
    """(namespace, pod) to the devices of this driver the kubelet prepared for it."""
    found: dict[tuple[str, str], list[str]] = {}
    with PodResourcesClient("/var/lib/kubelet/pod-resources/kubelet.sock") as client:
        for namespace, pod, _, claim in client.list_claim_allocations():
            if claim.driver == DRIVER:
                found.setdefault((namespace, pod), []).append(claim.device)
    return found


def ready(node: Node, pod: str, namespace: str = "default") -> None:
    node.kubectl("wait", "--for=condition=Ready", f"pod/{pod}", "-n", namespace,
                 "--timeout=120s", timeout=150)  # fmt: skip


def by_device(gpus: list[DraGpu], device: str) -> DraGpu:
    return next(g for g in gpus if g.device == device)


# ---- flows -------------------------------------------------------------------------


def test_a_pod_with_a_resource_claim_runs_with_what_cdi_injects(
    node: Node, dra: list[DraGpu]
) -> None:
    with ordinary_claim_pod(node) as pod:
        ready(node, pod)
        [device] = allocated(node, pod)
        uid = json.loads(node.kubectl("get", "resourceclaim", pod, "-o", "json").stdout)[
            "metadata"
        ]["uid"]
        env = node.kubectl("exec", pod, "--", "env").stdout.splitlines()
        # Only the driver's CDI spec (in /var/run/cdi, for this claim) sets these.
        number = device.removeprefix("gpu-")
        assert f"GPU_DEVICE_{number}={device}" in env, env
        key = device.upper().replace("-", "_")
        assert f"GPU_DEVICE_{key}_RESOURCE_CLAIM={uid}" in env, env
        specs = [p.read_text() for p in Path(CDI_DIRS[1]).iterdir() if p.is_file()]
        assert any(uid in spec for spec in specs), specs
        # The kubelet reports the prepared device in PodResources (dynamic_resources).
        assert dra_pod_resources()[("default", pod)] == [device]


def test_a_pin_is_a_claim_on_exactly_its_gpu_and_ordinary_dra_pods_get_the_other(
    node: Node, dra: list[DraGpu]
) -> None:
    # GPU 1, not 0: a claim without the UUID selector would be given the first free device
    pinned, other = dra[1], dra[0]
    name = flows.new_name("pinned")
    with flows.running_pod(node, flows.quick_pod_manifest(name)) as pod:
        reply = flows.nvcli_ok(node, "alice", "mount", "--name", pod, "--mount", pinned.uuid)
        try:
            pin = flows.the_pin(node, pod)["metadata"]["name"]
            assert [m.get("pin") for m in reply["mounted"]] == [pin], reply
            # The pin's claim, allocated by the scheduler to exactly the pinned GPU.
            assert allocated(node, pin) == [pinned.device]
            assert dra_pod_resources()[("default", pin)] == [pinned.device]
            assert flows.device_state(node, pod, pinned.index) == GRANTED

            with ordinary_claim_pod(node) as first:
                ready(node, first)
                assert allocated(node, first) == [other.device]
                with ordinary_claim_pod(node) as second:
                    flows.wait_unschedulable(node, second)
                    assert allocated(node, second) == []

                    flows.nvcli_ok(node, "alice", "unmount", "--name", pod, "--all")
                    # The pin and its claim go; the waiting pod gets the GPU at last.
                    ready(node, second)
                    assert allocated(node, second) == [pinned.device]
                    flows.wait_for("the pin's claim is gone", lambda: node.kubectl(
                        "get", "resourceclaim", pin, check=False).returncode != 0, 60)  # fmt: skip
        finally:
            flows.nvcli(node, "alice", "unmount", "--name", pod, "--all")


def test_a_gpu_a_dra_pod_holds_is_refused_with_409(node: Node, dra: list[DraGpu]) -> None:
    with ordinary_claim_pod(node) as holder:
        ready(node, holder)
        [device] = allocated(node, holder)
        held = by_device(dra, device)
        name = flows.new_name("wants")
        with flows.running_pod(node, flows.quick_pod_manifest(name)) as pod:
            refused = flows.nvcli(node, "alice", "mount", "--name", pod, "--mount", held.uuid)
            assert refused.returncode == EXIT_CONFLICT, (refused.returncode, refused.stderr)
            assert holder in refused.stderr, refused.stderr
            assert flows.mounted_uuids(node, "alice", pod) == []
            assert flows.device_state(node, pod, held.index) == ABSENT
            assert flows.pins(node, pod) == []


def test_a_quota_on_the_class_is_charged_by_a_pin_and_refuses_the_next_with_exit_7(
    node: Node, dra: list[DraGpu]
) -> None:
    namespace, quota = flows.new_name("dra-quota"), flows.new_name("one-gpu")
    resource = f"{CLASS}.deviceclass.resource.k8s.io/devices"
    node.kubectl("create", "namespace", namespace)
    try:
        node.kubectl(
            "create", "rolebinding", "alice-hotmount", "-n", namespace,
            f"--clusterrole={flows.USER_ROLE}", "--user=alice",
        )  # fmt: skip
        node.kubectl("create", "quota", quota, "-n", namespace, f"--hard={resource}=1")
        flows.wait_for("the quota is counted", lambda: _quota(node, namespace, quota), 60)
        flows.wait_for(
            "the default ServiceAccount", lambda: node.service_account_ready(namespace), 60
        )
        name = flows.new_name("tenant")
        with flows.running_pod(node, flows.quick_pod_manifest(name, namespace)) as pod:
            flows.nvcli_ok(
                node, "alice", "mount", "--name", pod, "-n", namespace, "--mount", dra[0].uuid
            )
            assert _quota(node, namespace, quota)["used"] == {resource: "1"}
            refused = flows.nvcli(
                node, "alice", "mount", "--name", pod, "-n", namespace, "--mount", dra[1].uuid
            )
            assert refused.returncode == EXIT_QUOTA, (refused.returncode, refused.stderr)
            assert quota in refused.stderr, refused.stderr
            assert flows.mounted_uuids(node, "alice", pod, namespace) == [dra[0].uuid]
            assert flows.device_state(node, pod, dra[1].index, namespace) == ABSENT
            assert len(flows.pins(node, namespace=namespace)) == 1
            flows.nvcli_ok(node, "alice", "unmount", "--name", pod, "-n", namespace, "--all")
    finally:
        node.kubectl("delete", "namespace", namespace, "--wait=true", "--timeout=120s",
                     check=False, timeout=150)  # fmt: skip


def _quota(node: Node, namespace: str, quota: str) -> dict[str, Any]:
    found = node.kubectl("get", "resourcequota", quota, "-n", namespace, "-o", "json").stdout
    status: dict[str, Any] = json.loads(found).get("status", {})
    return status if status.get("hard") else {}


def test_a_pod_asking_the_extended_resource_name_is_in_the_same_books(
    node: Node, gpus: flows.Gpus, dra: list[DraGpu]
) -> None:
    """KEP-5004: the DeviceClass serves nvidia.com/gpu where no device plugin advertises it
    (the scheduler prefers a node's device plugin), so the fake plugin stops meanwhile."""
    gpus.plugin.stop()
    try:
        flows.wait_for("no device plugin GPU is allocatable", lambda: _allocatable(node) == 0, 90)
        name = flows.new_name("extended")
        node.apply(flows.gpu_pod_manifest(name, 1))
        try:
            ready(node, name)
            pod = flows.get_pod(node, name)
            assert pod is not None
            status = pod["status"]["extendedResourceClaimStatus"]
            claim = status["resourceClaimName"]
            [device] = allocated(node, claim)
            assert dra_pod_resources()[("default", name)] == [device]
            held = by_device(dra, device)
            wants = flows.new_name("wants")
            with flows.running_pod(node, flows.quick_pod_manifest(wants)) as target:
                refused = flows.nvcli(
                    node, "alice", "mount", "--name", target, "--mount", held.uuid
                )
                assert refused.returncode == EXIT_CONFLICT, (refused.returncode, refused.stderr)
                assert name in refused.stderr, refused.stderr
        finally:
            flows.delete_pod(node, name)
    finally:
        gpus.plugin.start()
        flows.wait_allocatable(node, len(flows.NVML_GPUS))


def _allocatable(node: Node) -> int:
    found = node.kubectl("get", "node", NODE_NAME, "-o", "json").stdout
    allocatable = json.loads(found)["status"].get("allocatable", {})
    return int(allocatable.get(EXTENDED_RESOURCE, "0"))
