"""Which claims collide: footprints of GPUs, MIG instances and CDI names; the sharing rules."""

from __future__ import annotations

import pytest

from hotmount.devices.inventory import Inventory
from hotmount.devices.model import Device, DeviceKind, DeviceNode
from hotmount.state.claims import UNKNOWN, Claim, Footprint, blocking, circle, footprint, joined

CTL = DeviceNode("/dev/nvidiactl", 195, 255)
GPU0 = Device("GPU-0", DeviceKind.GPU, (DeviceNode("/dev/nvidia0", 195, 0),), (CTL,))
GPU1 = Device("GPU-1", DeviceKind.GPU, (DeviceNode("/dev/nvidia1", 195, 1),), (CTL,))


def mig(gi: int, ci: int, parent: int = 0) -> Device:
    caps = "/dev/nvidia-caps/nvidia-cap"
    gi = gi + 100 * parent  # every (GPU, GI, CI) has its own capability minors
    return Device(
        f"MIG-GPU-{parent}/{gi}/{ci}",
        DeviceKind.MIG,
        (
            DeviceNode(f"/dev/nvidia{parent}", 195, parent),
            DeviceNode(f"{caps}{gi * 10}", 236, gi * 10),
            DeviceNode(f"{caps}{gi * 10 + ci + 1}", 236, gi * 10 + ci + 1),
        ),
        (CTL,),
    )


def cdi(name: str, *nodes: DeviceNode) -> Device:
    return Device(f"nvidia.com/gpu={name}", DeviceKind.CDI, nodes, (CTL,))


ALL = cdi("all", *GPU0.nodes, *GPU1.nodes)
CDI_MIG = cdi("0:1", *mig(1, 0).nodes)  # nvidia-ctk's name for the same MIG instance


@pytest.mark.parametrize(
    ("a", "b", "collide"),
    [
        (GPU0, cdi("0", *GPU0.nodes), True),
        (GPU0, ALL, True),
        (GPU1, ALL, True),
        (GPU0, GPU1, False),
        (GPU0, mig(1, 0), True),
        (mig(1, 0), GPU0, True),
        (mig(1, 0), mig(2, 0), False),
        (mig(1, 0), mig(1, 0, parent=1), False),
        (mig(1, 0), CDI_MIG, True),
        (CDI_MIG, mig(2, 0), False),
        (ALL, mig(2, 0), True),
        (GPU1, mig(1, 0), False),
    ],
    ids=["index-and-cdi-alias", "gpu0-and-all", "gpu1-and-all", "two-gpus",
         "gpu-then-its-mig", "mig-then-its-gpu", "sibling-migs", "migs-of-two-gpus",
         "mig-and-its-cdi-name", "cdi-mig-and-a-sibling", "all-and-a-mig", "other-gpu-and-a-mig"],
)  # fmt: skip
def test_footprints_overlap_on_the_physical_device(a: Device, b: Device, collide: bool) -> None:
    assert footprint(a).overlaps(footprint(b)) is collide
    assert footprint(b).overlaps(footprint(a)) is collide


def test_control_nodes_never_count() -> None:
    # A CDI device that lists nvidiactl among its own nodes does not hold every GPU.
    odd = cdi("odd", CTL, DeviceNode("/dev/nvidia7", 195, 7))
    assert footprint(odd).exclusive == {(195, 7)}
    assert not footprint(odd).overlaps(footprint(GPU0))


def test_unknown_overlaps_everything() -> None:
    assert UNKNOWN.overlaps(Footprint()) and footprint(GPU0).overlaps(UNKNOWN)


def test_inventory_folds_aliases_and_maps_every_kubelet_id() -> None:
    alias = cdi("GPU-0", *GPU0.nodes)
    mig_uuid = cdi("MIG-4f1e", *mig(1, 0).nodes)
    readonly = cdi("ro", DeviceNode("/dev/nvidia0", 195, 0, permissions="r"))
    inventory = Inventory([GPU0, GPU1, mig(1, 0), cdi("0", *GPU0.nodes), alias, mig_uuid, readonly])

    keys = [d.key for d in inventory.devices]
    assert keys == ["GPU-0", "GPU-1", "MIG-GPU-0/1/0", "nvidia.com/gpu=ro"]
    assert inventory.get("GPU-0").aliases == ("nvidia.com/gpu=0", "nvidia.com/gpu=GPU-0")
    for kubelet_id, key in [
        ("GPU-0", "GPU-0"),
        ("GPU-1::3", "GPU-1"),  # time-sliced replica
        ("MIG-GPU-0/1/0", "MIG-GPU-0/1/0"),
        ("MIG-4f1e", "MIG-GPU-0/1/0"),  # a MIG UUID, known through its CDI name
        ("nvidia.com/gpu=GPU-0", "GPU-0"),  # a CDI name from PodResources
        ("nvidia.com/gpu=MIG-4f1e::1", "MIG-GPU-0/1/0"),
    ]:
        device = inventory.kubelet_device(kubelet_id)
        assert device is not None and device.key == key, kubelet_id
    assert inventory.kubelet_device("GPU-9") is None
    assert [d.key for d in inventory.overlapping(inventory.footprint(GPU0))] == [
        "GPU-0",
        "MIG-GPU-0/1/0",
        "nvidia.com/gpu=ro",
    ]


def claim(owner: str, group: str, shared_with: str | None = None, dev: Device = GPU0) -> Claim:
    return Claim(owner, dev.key, group, footprint(dev), shared_with)


def test_same_container_and_same_pod_never_block() -> None:
    held = [claim("c1", "ml/a")]
    assert blocking(claim("c1", "ml/a", dev=ALL), held) == []
    assert blocking(claim("c2", "ml/a"), held) == []
    assert blocking(claim("c3", "ml/b"), held) == held


def test_sharing_needs_a_current_holder_named() -> None:
    producer = claim("c1", "ml/producer")
    consumer = claim("c2", "ml/consumer", shared_with="ml/producer")
    held = [producer, consumer]
    assert blocking(claim("c3", "ml/third"), held) == held
    assert blocking(claim("c3", "ml/third"), held, share_with="ml/nobody") == held
    assert blocking(claim("c3", "ml/third"), held, share_with="ml/consumer") == []
    assert blocking(claim("c3", "ml/third"), held, share_with="ml/producer") == []
    # A second container of a pod in the circle keeps it, and records the link.
    later = claim("c4", "ml/consumer")
    assert blocking(later, held) == []
    assert joined(later, held, None) == "ml/producer"


def test_a_link_for_one_gpu_opens_no_other() -> None:
    held = [claim("c1", "ml/p"), claim("c2", "ml/c", "ml/p"), claim("c5", "ml/p", dev=GPU1)]
    [other_gpu] = blocking(claim("c2", "ml/c", dev=GPU1), held)
    assert other_gpu.device == "GPU-1"


def test_circle_follows_links_both_ways() -> None:
    held = [claim("c2", "b", "a"), claim("c3", "c", "b"), claim("c9", "z")]
    assert circle(["c"], held) == {"a", "b", "c"}
    assert circle(["z"], held) == {"z"}
