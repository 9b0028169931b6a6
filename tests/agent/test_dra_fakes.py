"""A DRA pin through the real clients: ResourceApi (the official client) against the fake
API server's resource.k8s.io/v1, and PodResourcesClient against the fake kubelet's socket.

The claim is the one agent/books/dra.py builds, the holder the one it rewrites; nothing is
patched, so a wrong field name on either side shows up as a pod that never schedules.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from kubernetes import client as k8s

from agent.books.dra import GPU_DRIVER, ClaimAllocation, claim_manifest, slice_devices, with_claim
from agent.errors import Forbidden, UpstreamError
from agent.kube.dra import ResourceApi
from agent.podresources import PodResourcesClient
from agent.podresources.generated import api_pb2, api_pb2_grpc
from tests.fakes import FakeKubeApiServer, FakePodResourcesServer
from tests.fakes.dra import nvidia_slice

GPU0 = "GPU-aaaaaaaa-0000-4000-8000-000000000000"
GPU1 = "GPU-aaaaaaaa-0000-4000-8000-000000000001"
MIG0 = "MIG-aaaaaaaa-0000-4000-8000-00000000000a"
GPU_B = "GPU-bbbbbbbb-0000-4000-8000-000000000000"
NS = "ml"


def holder(name: str, claim: str) -> dict[str, Any]:
    amounts = {"nvidia.com/gpu": "1", "cpu": "10m", "memory": "16Mi"}
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "containers": [
                {
                    "name": "holder",
                    "image": "pause",
                    "resources": {"limits": dict(amounts), "requests": dict(amounts)},
                }
            ]
        },
    }
    return with_claim(pod, claim)


@pytest.fixture
def kubelet() -> Iterator[FakePodResourcesServer]:
    with FakePodResourcesServer() as server:
        yield server


@pytest.fixture
def fake(kubelet: FakePodResourcesServer) -> Iterator[FakeKubeApiServer]:
    # No device-plugin GPUs at all: on these nodes DRA is the only book.
    with FakeKubeApiServer(
        nodes={"node-a": [], "node-b": []}, podresources={"node-a": kubelet}
    ) as server:
        server.put_resource_slice(
            nvidia_slice("node-a", {"gpu-0": ("gpu", GPU0), "gpu-1": ("gpu", GPU1)})
        )
        server.put_resource_slice(nvidia_slice("node-b", {"gpu-0": ("gpu", GPU_B)}))
        yield server


@pytest.fixture
def api(fake: FakeKubeApiServer) -> Iterator[k8s.ApiClient]:
    with fake.api_client() as client:
        yield client


@pytest.fixture
def resources(api: k8s.ApiClient) -> ResourceApi:
    return ResourceApi(api)


@pytest.fixture
def podresources(kubelet: FakePodResourcesServer) -> Iterator[PodResourcesClient]:
    with PodResourcesClient(kubelet.socket_path) as client:
        yield client


def pin(resources: ResourceApi, name: str, uuid: str, *, mig: bool = False) -> dict[str, Any]:
    manifest = claim_manifest(NS, name, uuid, mig=mig, labels={"hotmount.io/pin": "1"}, owner=None)
    return resources.create_claim(NS, manifest)


def create_pod(api: k8s.ApiClient, manifest: dict[str, Any]) -> k8s.V1Pod:
    return k8s.CoreV1Api(api).create_namespaced_pod(NS, manifest)


def scheduled(pod: k8s.V1Pod) -> k8s.V1PodCondition:
    return next(c for c in pod.status.conditions or [] if c.type == "PodScheduled")


def test_the_node_lists_its_own_gpus_by_uuid(resources: ResourceApi) -> None:
    found = slice_devices(resources.node_slices("node-a"), "node-a")

    assert {(d.device, d.uuid) for d in found} == {("gpu-0", GPU0), ("gpu-1", GPU1)}
    assert all(d.pool == "node-a" and d.driver == GPU_DRIVER for d in found)


def test_the_field_selectors_are_the_api_servers(api: k8s.ApiClient) -> None:
    listed = k8s.ResourceV1Api(api).list_resource_slice(field_selector=f"spec.driver={GPU_DRIVER}")
    assert sorted(s.spec.node_name for s in listed.items) == ["node-a", "node-b"]

    with pytest.raises(k8s.ApiException) as refused:
        k8s.ResourceV1Api(api).list_resource_slice(field_selector="spec.pool.name=node-a")
    assert refused.value.status == 400


def test_a_pinned_gpu_is_allocated_reserved_and_reported_by_the_kubelet(
    api: k8s.ApiClient, resources: ResourceApi, podresources: PodResourcesClient
) -> None:
    claim = pin(resources, "pin-gpu1", GPU1)
    assert "status" not in claim or not claim["status"]  # nothing allocates a claim alone

    pod = create_pod(api, holder("hotmount-pin-a", "pin-gpu1"))

    assert pod.spec.node_name == "node-a" and pod.status.phase == "Running"
    allocated = resources.get_claim(NS, "pin-gpu1")
    assert allocated is not None
    status = allocated["status"]
    assert status["allocation"]["devices"]["results"] == [
        {"request": "gpu", "driver": GPU_DRIVER, "pool": "node-a", "device": "gpu-1"}
    ]
    assert status["reservedFor"] == [
        {"resource": "pods", "name": "hotmount-pin-a", "uid": pod.metadata.uid}
    ]
    [(namespace, name, container, allocation)] = podresources.list_claim_allocations()
    assert (namespace, name, container) == (NS, "hotmount-pin-a", "holder")
    assert allocation == ClaimAllocation(
        namespace=NS,
        claim="pin-gpu1",
        driver=GPU_DRIVER,
        pool="node-a",
        device="gpu-1",
        cdi_devices=(f"k8s.gpu.nvidia.com/claim={claim['metadata']['uid']}-gpu-1",),
    )
    # The books' triplet leads back to the UUID the pin was made for.
    [device] = [
        d
        for d in slice_devices(resources.node_slices("node-a"), "node-a")
        if (d.driver, d.pool, d.device) == (allocation.driver, allocation.pool, allocation.device)
    ]
    assert device.uuid == GPU1
    # list_allocations() keeps reporting DRA devices by claim and CDI name, as before.
    [legacy] = podresources.list_allocations()
    assert (legacy.resource_name, legacy.device_ids) == ("pin-gpu1", allocation.cdi_devices)


def test_a_second_claim_on_the_same_gpu_waits_until_the_first_pod_is_gone(
    api: k8s.ApiClient, resources: ResourceApi, podresources: PodResourcesClient
) -> None:
    pin(resources, "first", GPU0)
    pin(resources, "second", GPU0)
    create_pod(api, holder("holder-1", "first"))

    waiting = create_pod(api, holder("holder-2", "second"))

    assert waiting.status.phase == "Pending" and waiting.spec.node_name is None
    condition = scheduled(waiting)
    assert (condition.status, condition.reason) == ("False", "Unschedulable")
    # node-a: the GPU is held; node-b: no device with that UUID.
    assert condition.message == "0/2 nodes are available: 2 cannot allocate all claims."
    assert "allocation" not in (resources.get_claim(NS, "second") or {}).get("status", {})
    assert [a[1] for a in podresources.list_claim_allocations()] == ["holder-1"]

    k8s.CoreV1Api(api).delete_namespaced_pod("holder-1", NS, grace_period_seconds=0)

    assert not (resources.get_claim(NS, "first") or {}).get("status")  # deallocated
    moved = k8s.CoreV1Api(api).read_namespaced_pod("holder-2", NS)
    assert (moved.spec.node_name, moved.status.phase) == ("node-a", "Running")
    [(_, name, _, allocation)] = podresources.list_claim_allocations()
    assert (name, allocation.claim, allocation.device) == ("holder-2", "second", "gpu-0")


def test_the_other_gpu_stays_free_for_another_pin(
    api: k8s.ApiClient, resources: ResourceApi, podresources: PodResourcesClient
) -> None:
    pin(resources, "pin-0", GPU0)
    pin(resources, "pin-1", GPU1)
    create_pod(api, holder("holder-0", "pin-0"))
    create_pod(api, holder("holder-1", "pin-1"))

    held = {(a[1], a[3].device) for a in podresources.list_claim_allocations()}
    assert held == {("holder-0", "gpu-0"), ("holder-1", "gpu-1")}


def test_a_pod_waits_for_its_claim_and_runs_once_it_exists(
    api: k8s.ApiClient, resources: ResourceApi
) -> None:
    waiting = create_pod(api, holder("early", "not-yet"))
    assert waiting.status.phase == "Pending"
    assert 'resourceclaim.resource.k8s.io "not-yet" not found' in scheduled(waiting).message

    pin(resources, "not-yet", GPU1)

    pod = k8s.CoreV1Api(api).read_namespaced_pod("early", NS)
    assert (pod.spec.node_name, pod.status.phase) == ("node-a", "Running")


def test_the_device_class_is_part_of_the_selection(
    api: k8s.ApiClient, fake: FakeKubeApiServer, resources: ResourceApi
) -> None:
    fake.put_resource_slice(nvidia_slice("node-b", {"gpu-0-mig-1g10gb-0": ("mig", MIG0)}))
    # The MIG device's UUID through the GPU class would match its CEL but not the class.
    wrong = claim_manifest(NS, "wrong", MIG0, mig=True, labels={}, owner=None)
    wrong["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"] = "gpu.nvidia.com"
    resources.create_claim(NS, wrong)
    pin(resources, "right", MIG0, mig=True)

    assert create_pod(api, holder("wrong", "wrong")).status.phase == "Pending"
    pod = create_pod(api, holder("right", "right"))
    assert (pod.spec.node_name, pod.status.phase) == ("node-b", "Running")


def test_a_claim_deleted_while_reserved_stays_until_its_pod_is_gone(
    api: k8s.ApiClient, resources: ResourceApi
) -> None:
    pin(resources, "pin", GPU0)
    create_pod(api, holder("holder", "pin"))

    resources.delete_claim(NS, "pin")

    kept = resources.get_claim(NS, "pin")
    assert kept is not None and kept["metadata"]["deletionTimestamp"]
    assert kept["status"]["reservedFor"][0]["name"] == "holder"
    k8s.CoreV1Api(api).delete_namespaced_pod("holder", NS, grace_period_seconds=0)
    assert resources.get_claim(NS, "pin") is None
    resources.delete_claim(NS, "pin")  # already gone: not an error


def test_the_kubelets_get_reports_the_dra_fields(
    api: k8s.ApiClient, resources: ResourceApi, kubelet: FakePodResourcesServer
) -> None:
    pin(resources, "pin", GPU1)
    create_pod(api, holder("holder", "pin"))

    with grpc.insecure_channel(f"unix://{kubelet.socket_path}") as channel:
        stub = api_pb2_grpc.PodResourcesListerStub(channel)
        got = stub.Get(api_pb2.GetPodResourcesRequest(pod_name="holder", pod_namespace=NS))

    [container] = got.pod_resources.containers
    [dynamic] = container.dynamic_resources
    assert (dynamic.class_name, dynamic.claim_name, dynamic.claim_namespace) == ("", "pin", NS)
    [resource] = dynamic.claim_resources
    assert (resource.driver_name, resource.pool_name, resource.device_name) == (
        GPU_DRIVER,
        "node-a",
        "gpu-1",
    )
    assert list(container.devices) == []  # no device-plugin GPU besides the claim


def test_a_claim_with_broken_cel_is_refused_by_the_api_server(resources: ResourceApi) -> None:
    broken = claim_manifest(NS, "broken", GPU0, mig=False, labels={}, owner=None)
    broken["spec"]["devices"]["requests"][0]["exactly"]["selectors"][0]["cel"]["expression"] = (
        'device.attributes["gpu.nvidia.com"].uuid == ('
    )

    with pytest.raises(UpstreamError, match="422"):
        resources.create_claim(NS, broken)
    assert resources.get_claim(NS, "broken") is None


def test_api_errors_map_as_the_agents_kube_client_maps_them(
    fake: FakeKubeApiServer, resources: ResourceApi
) -> None:
    pin(resources, "pin", GPU0)
    with pytest.raises(UpstreamError, match="409"):
        pin(resources, "pin", GPU0)

    fake.add_token("nobody-token", "nobody")
    with fake.api_client("nobody-token") as client:
        outsider = ResourceApi(client)
        with pytest.raises(Forbidden):
            outsider.get_claim(NS, "pin")
        with pytest.raises(Forbidden):
            outsider.node_slices("node-a")
        with pytest.raises(Forbidden):
            outsider.delete_claim(NS, "pin")


def test_a_cluster_without_dra_has_no_slices() -> None:
    with (
        FakeKubeApiServer(nodes={"node-a": []}, serve_dra=False) as fake,
        fake.api_client() as client,
    ):
        resources = ResourceApi(client)
        assert resources.node_slices("node-a") == []
        assert resources.get_claim(NS, "pin") is None  # the same 404
