"""Which nodes a mount adds and an unmount removes: reference counting over a ledger record."""

from __future__ import annotations

import pytest

from hotmount.devices.model import Device, DeviceKind, DeviceNode
from hotmount.engine.plan import kept_numbers, node_of, nodes_to_add, nodes_to_remove
from hotmount.errors import UnsafePath
from hotmount.state.ledger import ContainerRecord, DeviceRecord, NodeRecord

CTL = DeviceNode("/dev/nvidiactl", 195, 255)
UVM = DeviceNode("/dev/nvidia-uvm", 511, 0)
UVM_TOOLS = DeviceNode("/dev/nvidia-uvm-tools", 511, 1)
CONTROL = (CTL, UVM, UVM_TOOLS)


def gpu(minor: int) -> Device:
    return Device(
        key=f"GPU-{minor}",
        kind=DeviceKind.GPU,
        nodes=(DeviceNode(f"/dev/nvidia{minor}", 195, minor),),
        shared_nodes=CONTROL,
        minor=minor,
    )


def mig(parent_minor: int, gi_cap: int, ci_cap: int) -> Device:
    return Device(
        key=f"MIG-GPU-{parent_minor}/{gi_cap}/{ci_cap}",
        kind=DeviceKind.MIG,
        nodes=(
            DeviceNode(f"/dev/nvidia{parent_minor}", 195, parent_minor),
            DeviceNode(f"/dev/nvidia-caps/nvidia-cap{gi_cap}", 236, gi_cap),
            DeviceNode(f"/dev/nvidia-caps/nvidia-cap{ci_cap}", 236, ci_cap),
        ),
        shared_nodes=CONTROL,
        parent=f"GPU-{parent_minor}",
    )


def cdi(name: str, *nodes: DeviceNode) -> Device:
    return Device(key=f"vendor.com/dev={name}", kind=DeviceKind.CDI, nodes=nodes)


def record_with(*devices: Device) -> ContainerRecord:
    """A ledger record as the engine leaves it after mounting `devices`."""
    record = ContainerRecord(
        key="c" * 64, container_id="c" * 64, init_pid=4242, init_start_time=1, v1_dir=None,
        v2_dir="/sys/fs/cgroup/x",
    )  # fmt: skip
    for device in devices:
        for node in device.all_nodes:
            record.nodes.setdefault(
                node.path,
                NodeRecord(
                    path=node.path, major=node.major, minor=node.minor,
                    file_mode=node.file_mode, permissions=node.permissions, created=True,
                ),
            )  # fmt: skip
        record.devices[device.key] = DeviceRecord(
            key=device.key,
            kind=str(device.kind),
            node_paths=[n.path for n in device.all_nodes],
            mounted_at="2024-01-01T00:00:00+00:00",
        )
    return record


def paths(nodes: list[DeviceNode] | list[NodeRecord]) -> list[str]:
    return [n.path for n in nodes]


# -- nodes_to_add


@pytest.mark.parametrize(
    ("mounted", "adding", "expected"),
    [
        ((), (gpu(0),), ["/dev/nvidia0", *paths(list(CONTROL))]),
        ((), (gpu(0), gpu(1)), ["/dev/nvidia0", *paths(list(CONTROL)), "/dev/nvidia1"]),
        ((gpu(0),), (gpu(1),), ["/dev/nvidia1"]),
        ((gpu(0),), (gpu(0),), []),
        (
            (),
            (mig(2, 30, 31),),
            ["/dev/nvidia2", "/dev/nvidia-caps/nvidia-cap30", "/dev/nvidia-caps/nvidia-cap31",
             *paths(list(CONTROL))],
        ),
        ((gpu(2),), (mig(2, 30, 31),), ["/dev/nvidia-caps/nvidia-cap30",
                                         "/dev/nvidia-caps/nvidia-cap31"]),
        ((mig(2, 30, 31),), (mig(2, 30, 32),), ["/dev/nvidia-caps/nvidia-cap32"]),
        ((), (cdi("tun", DeviceNode("/dev/net/tun", 10, 200)),), ["/dev/net/tun"]),
    ],
    ids=["first-gpu-brings-control", "two-gpus-control-once", "second-gpu-only-its-node",
         "already-mounted", "first-mig", "mig-after-parent-gpu", "second-ci-same-gi",
         "cdi-no-shared"],
)  # fmt: skip
def test_nodes_to_add(
    mounted: tuple[Device, ...], adding: tuple[Device, ...], expected: list[str]
) -> None:
    assert paths(nodes_to_add(record_with(*mounted), list(adding))) == expected


def test_nodes_to_add_keeps_the_device_node_itself() -> None:
    node = DeviceNode("/dev/infiniband/uverbs0", 231, 192, 0o640, "r")
    assert nodes_to_add(record_with(), [cdi("nic", node)]) == [node]


@pytest.mark.parametrize(
    ("mounted", "adding"),
    [
        ((gpu(0),), (cdi("fake", DeviceNode("/dev/nvidia0", 195, 3)),)),
        ((gpu(0),), (cdi("ctl", DeviceNode("/dev/nvidiactl", 195, 254)),)),
        ((), (gpu(0), cdi("fake", DeviceNode("/dev/nvidia0", 8, 0)))),
        ((), (gpu(0), cdi("uvm", DeviceNode("/dev/nvidia-uvm", 510, 0)))),
    ],
    ids=["vs-ledger-own-node", "vs-ledger-shared-node", "within-request", "within-request-shared"],
)
def test_one_path_two_device_numbers_is_unsafe(
    mounted: tuple[Device, ...], adding: tuple[Device, ...]
) -> None:
    with pytest.raises(UnsafePath, match=r"is wanted as .* but is already"):
        nodes_to_add(record_with(*mounted), list(adding))


def test_same_path_same_numbers_different_mode_is_not_a_conflict() -> None:
    # Only major:minor decide whether it is the same device; the first request wins the mode.
    loose = cdi("ctl", DeviceNode("/dev/nvidiactl", 195, 255, 0o600, "r"))
    assert paths(nodes_to_add(record_with(), [gpu(0), loose])) == [
        "/dev/nvidia0", *paths(list(CONTROL)),
    ]  # fmt: skip


# -- nodes_to_remove

G0, G1, G2, M2 = gpu(0), gpu(1), gpu(2), mig(2, 30, 31)


@pytest.mark.parametrize(
    ("mounted", "removing", "expected"),
    [
        ((G0,), [G0], sorted(["/dev/nvidia0", *paths(list(CONTROL))])),
        ((G0, G1), [G0], ["/dev/nvidia0"]),
        ((G0, G1), [G1], ["/dev/nvidia1"]),
        ((G0, G1), [G0, G1], sorted(["/dev/nvidia0", "/dev/nvidia1", *paths(list(CONTROL))])),
        ((G2, M2), [M2], ["/dev/nvidia-caps/nvidia-cap30", "/dev/nvidia-caps/nvidia-cap31"]),
        ((G2, M2), [G2], []),  # the MIG instance still needs /dev/nvidia2 and the control nodes
        (
            (G2, M2),
            [G2, M2],
            sorted(["/dev/nvidia2", "/dev/nvidia-caps/nvidia-cap30",
                    "/dev/nvidia-caps/nvidia-cap31", *paths(list(CONTROL))]),
        ),
        ((G0, M2), [G0], ["/dev/nvidia0"]),
        ((G0, M2), [M2], sorted(["/dev/nvidia2", "/dev/nvidia-caps/nvidia-cap30",
                                 "/dev/nvidia-caps/nvidia-cap31"])),
        ((G0, G1), [], []),
    ],
    ids=["last-gpu-takes-control", "first-of-two", "second-of-two", "both", "mig-leaves-parent",
         "parent-stays-for-mig", "parent-and-mig", "gpu-beside-mig", "mig-beside-other-gpu",
         "nothing"],
)  # fmt: skip
def test_nodes_to_remove(
    mounted: tuple[Device, ...], removing: list[Device], expected: list[str]
) -> None:
    record = record_with(*mounted)
    assert paths(nodes_to_remove(record, [d.key for d in removing])) == expected


def test_counting_down_one_device_at_a_time() -> None:
    record = record_with(G0, G1, G2)
    removed: list[str] = []
    for device in (G1, G0, G2):
        gone = paths(nodes_to_remove(record, [device.key]))
        removed.append(",".join(gone))
        del record.devices[device.key]
        for path in gone:
            del record.nodes[path]
    assert removed == [
        "/dev/nvidia1",
        "/dev/nvidia0",
        ",".join(sorted(["/dev/nvidia2", *paths(list(CONTROL))])),
    ]
    assert record.nodes == {}


def test_node_not_in_the_ledger_is_never_removed() -> None:
    # A node the runtime made (never recorded) is not ours to remove.
    record = record_with(G0)
    del record.nodes["/dev/nvidiactl"]
    assert "/dev/nvidiactl" not in paths(nodes_to_remove(record, [G0.key]))


def test_node_of_inverts_the_record() -> None:
    node = DeviceNode("/dev/infiniband/uverbs0", 231, 192, 0o640, "r")
    record = record_with(cdi("nic", node))
    assert node_of(record.nodes[node.path]) == node


# -- kept_numbers: what a holder of a leaving device must not also hold to be stopped


MIG1, MIG2 = mig(5, 1, 2), mig(5, 3, 4)


def own(*devices: Device) -> dict[str, tuple[DeviceNode, ...]]:
    return {d.key: d.nodes for d in devices}


@pytest.mark.parametrize(
    ("mounted", "leaving", "known", "expected"),
    [
        ((G0, G1), (G0,), (G1,), {(195, 1)}),  # never the control nodes that both use
        ((G0, G1, G2), (G0,), (G1, G2), {(195, 1), (195, 2)}),
        ((G0,), (G0,), (), set()),
        # MIG 1 leaves, MIG 2 of the same GPU stays: its caps are its own, the GPU node is not
        ((MIG1, MIG2), (MIG1,), (MIG2,), {(236, 3), (236, 4)}),
        # a device the inventory no longer knows: its nodes, less nvidiactl
        ((G0, G1), (G0,), (), {(195, 1)}),
    ],
    ids=["two-gpus", "three-gpus", "last-gpu", "mig-sibling", "unknown-staying"],
)
def test_kept_numbers_are_the_staying_devices_own_nodes(
    mounted: tuple[Device, ...],
    leaving: tuple[Device, ...],
    known: tuple[Device, ...],
    expected: set[tuple[int, int]],
) -> None:
    record = record_with(*mounted)
    assert kept_numbers(record, [d.key for d in leaving], own(*known)) == expected
