"""The DRA pin's pieces: a claim for exactly one GPU, the holder that uses it, the node's
devices as ResourceSlices publish them (agent/books/dra.py)."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from kubernetes import client as k8s

from agent.books.dra import (
    CLAIM_REF,
    GPU_CLASS,
    GPU_DRIVER,
    MIG_CLASS,
    DraNames,
    SliceDevice,
    claim_manifest,
    slice_devices,
    with_claim,
)

GPU = "GPU-4b8d0c3e-0000-4000-8000-000000000000"
MIG = "MIG-5c2a9d1e-0000-4000-8000-000000000000"
OWNER = {"apiVersion": "v1", "kind": "Pod", "name": "nb", "uid": "u-1", "controller": False}


def roundtrip(model: type, obj: dict[str, Any]) -> dict[str, Any]:
    """``obj`` read into the official client's model and written back: a misspelt or
    unknown field is dropped on the way, so the result differs from ``obj``."""
    return k8s.ApiClient().sanitize_for_serialization(model.from_dict(obj))


# -- claim_manifest -------------------------------------------------------------------


def test_a_claim_selects_exactly_the_gpu_by_uuid() -> None:
    claim = claim_manifest("ml", "pin-1", GPU, mig=False, labels={"a": "b"}, owner=OWNER)

    assert claim["apiVersion"] == "resource.k8s.io/v1" and claim["kind"] == "ResourceClaim"
    assert claim["metadata"] == {
        "name": "pin-1",
        "namespace": "ml",
        "labels": {"a": "b"},
        "ownerReferences": [OWNER],
    }
    [request] = claim["spec"]["devices"]["requests"]
    assert request == {
        "name": CLAIM_REF,
        "exactly": {
            "deviceClassName": GPU_CLASS,
            "allocationMode": "ExactCount",
            "count": 1,
            "selectors": [
                {"cel": {"expression": f'device.attributes["gpu.nvidia.com"].uuid == "{GPU}"'}}
            ],
        },
    }
    assert roundtrip(k8s.ResourceV1ResourceClaim, claim) == claim


def test_a_mig_claim_uses_the_mig_class_and_no_owner_is_no_reference() -> None:
    claim = claim_manifest("ml", "pin-2", MIG, mig=True, labels={}, owner=None)

    assert claim["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"] == MIG_CLASS
    assert (
        MIG
        in claim["spec"]["devices"]["requests"][0]["exactly"]["selectors"][0]["cel"]["expression"]
    )
    assert "ownerReferences" not in claim["metadata"]


@pytest.mark.parametrize(
    "uuid",
    [
        'GPU-1" || true || "',
        'GPU-1") || device.driver == ("x',
        "GPU-1\\",
        "GPU-1 ",
        "GPU-",
        "GPU-12g4",
        "GPU-1\n",
        "MIG-GPU-4b8d0c3e/1/0",
        "",
    ],
    ids=[
        "cel-or-true",
        "cel-paren",
        "backslash",
        "space",
        "no-digits",
        "not-hex",
        "newline",
        "old-mig-form",
        "empty",
    ],
)
def test_a_uuid_that_could_change_the_cel_is_refused(uuid: str) -> None:
    with pytest.raises(ValueError, match="not a GPU or MIG UUID"):
        claim_manifest("ml", "pin", uuid, mig=uuid.startswith("MIG-"), labels={}, owner=None)


def test_another_drivers_claim_names_its_driver_class_and_attribute_and_its_spelling() -> None:
    """The DRA example driver publishes `gpu-<uuid>`: the selector compares strings, so the
    claim carries the UUID as the driver spells it, with that driver's names."""
    names = DraNames("gpu.example.com", "gpu.example.com", "mig.example.com", "serial")
    claim = claim_manifest("ml", "pin", "gpu-4b8d0c3e-1", mig=False, labels={}, owner=None,
                           names=names)  # fmt: skip

    [request] = claim["spec"]["devices"]["requests"]
    assert request["exactly"]["deviceClassName"] == "gpu.example.com"
    assert request["exactly"]["selectors"] == [
        {"cel": {"expression": 'device.attributes["gpu.example.com"].serial == "gpu-4b8d0c3e-1"'}}
    ]


@pytest.mark.parametrize(
    "names",
    [
        DraNames(driver='gpu.example.com"].uuid == "x" || true || device.attributes["x'),
        DraNames(gpu_class="Gpu Class"),
        DraNames(uuid_attribute="uuid || true"),
        DraNames(uuid_attribute="uuid.x"),
    ],
    ids=["driver-cel", "class-space", "attribute-cel", "attribute-dot"],
)
def test_names_that_could_change_the_cel_are_refused(names: DraNames) -> None:
    with pytest.raises(ValueError, match="is not a name the API accepts"):
        claim_manifest("ml", "pin", GPU, mig=False, labels={}, owner=None, names=names)


@pytest.mark.parametrize(("uuid", "mig"), [(GPU, True), (MIG, False)], ids=["gpu-as-mig", "mig"])
def test_a_uuid_of_the_other_kind_is_refused(uuid: str, mig: bool) -> None:
    with pytest.raises(ValueError, match="is not a"):
        claim_manifest("ml", "pin", uuid, mig=mig, labels={}, owner=None)


# -- with_claim -----------------------------------------------------------------------

AMOUNTS = {"nvidia.com/gpu": "1", "cpu": "10m", "memory": "16Mi"}
HOLDER: dict[str, Any] = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {"name": "hotmount-pin-x", "namespace": "ml"},
    "spec": {
        "containers": [
            {
                "name": "holder",
                "image": "pause",
                "resources": {"limits": dict(AMOUNTS), "requests": dict(AMOUNTS)},
            }
        ]
    },
}


def test_the_holder_holds_its_gpu_through_the_claim_not_the_device_plugin() -> None:
    before = copy.deepcopy(HOLDER)

    pod = with_claim(HOLDER, "pin-1")

    assert before == HOLDER  # the caller's manifest is not touched
    assert pod["spec"]["resourceClaims"] == [{"name": CLAIM_REF, "resourceClaimName": "pin-1"}]
    [container] = pod["spec"]["containers"]
    assert container["resources"] == {
        "limits": {"cpu": "10m", "memory": "16Mi"},  # Guaranteed QoS stays
        "requests": {"cpu": "10m", "memory": "16Mi"},
        "claims": [{"name": CLAIM_REF}],
    }
    assert roundtrip(k8s.V1Pod, pod) == pod


def test_every_nvidia_plugin_resource_leaves_and_an_emptied_map_goes() -> None:
    holder = copy.deepcopy(HOLDER)
    holder["spec"]["containers"][0]["resources"] = {
        "limits": {"nvidia.com/mig-1g.10gb": "1"},
        "requests": {"nvidia.com/mig-1g.10gb": "1", "example.com/nic": "1"},
    }

    resources = with_claim(holder, "pin-1")["spec"]["containers"][0]["resources"]

    assert resources == {"requests": {"example.com/nic": "1"}, "claims": [{"name": CLAIM_REF}]}


def test_a_pod_with_other_than_one_container_is_refused() -> None:
    holder = copy.deepcopy(HOLDER)
    holder["spec"]["containers"].append({"name": "side", "image": "pause"})

    with pytest.raises(ValueError, match="one container, not 2"):
        with_claim(holder, "pin-1")


# -- slice_devices --------------------------------------------------------------------


def resource_slice(
    node: str,
    devices: list[dict[str, Any]],
    *,
    driver: str = GPU_DRIVER,
    generation: int = 1,
    per_device: bool = False,
) -> dict[str, Any]:
    """A ResourceSlice as NVIDIA's kubelet plugin publishes it (pool named after the node)."""
    spec: dict[str, Any] = {
        "driver": driver,
        "pool": {"name": node, "generation": generation, "resourceSliceCount": 1},
        "devices": devices,
    }
    if per_device:
        spec["perDeviceNodeSelection"] = True
    else:
        spec["nodeName"] = node
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-{driver}-x"},
        "spec": spec,
    }


def gpu(name: str, uuid: str | None, *, qualified: bool = False) -> dict[str, Any]:
    attributes: dict[str, Any] = {"type": {"string": "gpu"}, "index": {"int": 0}}
    if uuid is not None:
        attributes[f"{GPU_DRIVER}/uuid" if qualified else "uuid"] = {"string": uuid}
    return {"name": name, "attributes": attributes}


def test_the_nodes_gpus_come_with_their_uuids_named_bare_or_qualified() -> None:
    published = resource_slice(
        "node-a", [gpu("gpu-0", GPU), gpu("gpu-1", MIG, qualified=True), gpu("gpu-2", None)]
    )
    assert roundtrip(k8s.V1ResourceSlice, published) == published

    assert slice_devices([published], "node-a") == [
        SliceDevice(GPU_DRIVER, "node-a", "gpu-0", GPU),
        SliceDevice(GPU_DRIVER, "node-a", "gpu-1", MIG),
        SliceDevice(GPU_DRIVER, "node-a", "gpu-2", None),
    ]


def test_other_nodes_other_drivers_and_stale_generations_are_left_out() -> None:
    slices = [
        resource_slice("node-b", [gpu("gpu-0", "GPU-b0")]),
        resource_slice("node-a", [gpu("nic-0", "GPU-n0")], driver="dra.net"),
        resource_slice("node-a", [gpu("gpu-0", "GPU-old")], generation=1),
        resource_slice("node-a", [gpu("gpu-0", GPU)], generation=2),
    ]

    assert slice_devices(slices, "node-a") == [SliceDevice(GPU_DRIVER, "node-a", "gpu-0", GPU)]


def test_another_drivers_slices_are_read_by_its_name_and_attribute() -> None:
    theirs = {"name": "gpu-0", "attributes": {"serial": {"string": "gpu-4b8d"}}}
    nvidias = resource_slice("node-a", [gpu("gpu-0", GPU)])
    example = resource_slice("node-a", [theirs], driver="gpu.example.com")
    names = DraNames("gpu.example.com", "gpu.example.com", "mig.example.com", "serial")

    assert slice_devices([nvidias, example], "node-a", names) == [
        SliceDevice("gpu.example.com", "node-a", "gpu-0", "gpu-4b8d")
    ]


def test_per_device_node_selection_reads_each_devices_node() -> None:
    mine = {**gpu("gpu-0", GPU), "nodeName": "node-a"}
    theirs = {**gpu("gpu-1", MIG), "nodeName": "node-b"}
    published = resource_slice("pool-x", [mine, theirs], per_device=True)

    assert slice_devices([published], "node-a") == [SliceDevice(GPU_DRIVER, "pool-x", "gpu-0", GPU)]
