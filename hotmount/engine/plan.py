"""Which nodes an operation adds or removes: pure functions over a ledger record.

Nodes shared by several devices (control nodes, a MIG parent's GPU node) are
reference-counted through the devices' `node_paths`: a node comes with the
first device that needs it and goes with the last.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping

from hotmount.devices.model import Device, DeviceNode
from hotmount.errors import UnsafePath
from hotmount.state.claims import CONTROL_NUMBERS
from hotmount.state.ledger import ContainerRecord, NodeRecord


def nodes_to_add(record: ContainerRecord, devices: list[Device]) -> list[DeviceNode]:
    wanted: dict[str, DeviceNode] = {}
    for device in devices:
        for node in device.all_nodes:
            other = wanted.get(node.path)
            known = record.nodes.get(node.path)
            for previous in (other, known):
                if previous is not None and (previous.major, previous.minor) != (
                    node.major,
                    node.minor,
                ):
                    raise UnsafePath(
                        f"{node.path} is wanted as {node.major}:{node.minor} but is already "
                        f"{previous.major}:{previous.minor} for another device"
                    )
            if known is None:
                wanted[node.path] = node
    return list(wanted.values())


def nodes_to_remove(record: ContainerRecord, keys: list[str]) -> list[NodeRecord]:
    leaving = {path for key in keys for path in record.devices[key].node_paths}
    staying = {
        path
        for key, device in record.devices.items()
        if key not in keys
        for path in device.node_paths
    }
    return [record.nodes[path] for path in sorted(leaving - staying) if path in record.nodes]


def kept_numbers(
    record: ContainerRecord, keys: list[str], own: Mapping[str, Iterable[DeviceNode]]
) -> set[tuple[int, int]]:
    """The numbers of the nodes that are the staying devices' own (devices not in `keys`):
    `own[key]` where the inventory knows the device, else its nodes less the control
    nodes; never a node a leaving device also lists (a MIG parent's GPU node, nvidiactl).
    A process that holds one of them uses a device that stays."""
    going = {
        (record.nodes[p].major, record.nodes[p].minor)
        for key in keys
        for p in record.devices[key].node_paths
        if p in record.nodes
    }
    kept: set[tuple[int, int]] = set()
    for key, device in record.devices.items():
        if key in keys:
            continue
        if key in own:
            kept |= {(n.major, n.minor) for n in own[key]}
        else:
            paths = [p for p in device.node_paths if p in record.nodes]
            kept |= {(record.nodes[p].major, record.nodes[p].minor) for p in paths}
    return kept - going - CONTROL_NUMBERS


def node_of(record: NodeRecord) -> DeviceNode:
    return _node(record.path, record.major, record.minor, record.file_mode, record.permissions)


@functools.lru_cache(maxsize=4096)
def _node(path: str, major: int, minor: int, file_mode: int, permissions: str) -> DeviceNode:
    """Nodes are immutable values: one validated instance per spelling (a hot path)."""
    return DeviceNode(path, major, minor, file_mode, permissions)
