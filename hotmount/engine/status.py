"""A container's status: the ledger's record checked against the kernel."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from contextlib import AbstractContextManager

from hotmount.devices.model import DeviceRule
from hotmount.engine import plan
from hotmount.engine.grants import CgroupGrants, rule_of
from hotmount.engine.results import ContainerStatus, DeviceStatus, NodeStatus
from hotmount.errors import ContainerNotFound, UnsafePath
from hotmount.host.containers import Container
from hotmount.state.ledger import ContainerRecord, NodeRecord
from hotmount.tenantfs.devnodes import ContainerFs, NodeState


def container_status(
    record: ContainerRecord,
    container: Container | None,
    grants: CgroupGrants,
    fs_of: Callable[[Container], AbstractContextManager[ContainerFs]],
) -> ContainerStatus:
    """What the ledger says was added, checked against the kernel: each node's state in
    the container and whether its grant holds (v1 list, v2 map). A gone container: every
    node `unknown`, nothing granted."""
    v1, v2 = grants.v1(record.v1_dir), grants.v2(record.v2_dir)
    v2_grants: frozenset[DeviceRule] | None = None
    if container is not None and v2 is not None:
        with contextlib.suppress(ContainerNotFound):
            v2_state = v2.state()
            v2_grants = v2_state.grants if v2_state.restricted else None
    node_status: dict[str, NodeStatus] = {}
    fs_cm = fs_of(container) if container is not None else contextlib.nullcontext()
    with fs_cm as fs:
        for path, node_record in record.nodes.items():
            rule = rule_of(node_record)
            state = _state(fs, node_record) if fs else "unknown"
            granted = container is not None
            with contextlib.suppress(ContainerNotFound):
                if v1 is not None and container is not None:
                    granted = granted and v1.allows(rule)
            if v2_grants is not None:
                granted = granted and rule in v2_grants
            node_status[path] = NodeStatus(
                path,
                node_record.major,
                node_record.minor,
                state,
                granted,
                node_record.created,
            )
    devices = [
        DeviceStatus(
            d.key,
            d.kind,
            d.mounted_at,
            d.metadata,
            [node_status[p] for p in d.node_paths if p in node_status],
        )
        for d in record.devices.values()
    ]
    pending = record.pending.op if record.pending else None
    return ContainerStatus(
        record.key,
        record.container_id,
        record.init_pid,
        container is not None,
        devices,
        pending,
    )


def _state(fs: ContainerFs, node_record: NodeRecord) -> str:
    """A path the tenant made unsafe (a symlink or a volume on the way) reads as
    `mismatch`: something else is there, and one container cannot fail every status."""
    try:
        return fs.state(plan.node_of(node_record)).value
    except UnsafePath:
        return NodeState.MISMATCH.value
