"""The kernel steps of a mount and an unmount: grants, device nodes, and the driver's
files between them; their rollback, and finishing what a dead process left pending.

Order, so that no node appears that cannot be opened or before its libraries: a mount
grants, places the driver's files, then creates the nodes; an unmount (and a rollback)
removes the nodes, then the files, then revokes. The engine (hotmount/engine/core.py) decides
what an operation does and holds its locks, claims and pending record; these steps only
carry that plan out. Kept apart so that a mount, an unmount and reconcile, which all
finish a crashed operation, share one order and one rollback.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Callable
from contextlib import AbstractContextManager

from hotmount.cgroups.v1 import allows
from hotmount.devices.model import Device
from hotmount.driver.injection import DriverInjection
from hotmount.engine import plan
from hotmount.engine.grants import CgroupGrants, rule_of
from hotmount.errors import ContainerNotFound, UnsafePath
from hotmount.host.containers import Container
from hotmount.host.liveness import Liveness
from hotmount.state.ledger import ContainerRecord, Ledger, NodeRecord
from hotmount.tenantfs.devnodes import ContainerFs, NodeState

log = logging.getLogger(__name__)


class NodeSteps:
    """Carries one container's planned nodes out on the kernel, and back."""

    def __init__(
        self,
        grants: CgroupGrants,
        ledger: Ledger,
        driver: DriverInjection,
        fs_of: Callable[[Container], AbstractContextManager[ContainerFs]],
        proven: Callable[[ContainerRecord], Callable[[], None]],
    ) -> None:
        self.grants = grants
        self.ledger = ledger
        self.driver = driver
        self.fs_of = fs_of  # the container's filesystem, opened through its init
        self.proven = proven  # a check that the record's init is still the same process

    def plan(self, record: ContainerRecord, new: list[Device], fs: ContainerFs) -> list[NodeRecord]:
        """Read-only: which nodes to add, refusing paths held by something else."""
        v1 = self.grants.v1(record.v1_dir)
        v1_list = v1.entries() if v1 is not None else None
        pending = []
        for node in plan.nodes_to_add(record, new):
            state = fs.state(node)
            if state is NodeState.MISMATCH:
                raise UnsafePath(f"{node.path} in the container is not the expected device")
            pending.append(
                NodeRecord(
                    path=node.path,
                    major=node.major,
                    minor=node.minor,
                    file_mode=node.file_mode,
                    permissions=node.permissions,
                    created=state is NodeState.ABSENT,
                    v1_added=v1_list is not None and not allows(v1_list, node.rule),
                )
            )
        return pending

    def apply_mount(
        self,
        record: ContainerRecord,
        pending: list[NodeRecord],
        created: list[NodeRecord],
        fs: ContainerFs,
        alive: Liveness,
        place_driver: Callable[[], None] | None = None,
    ) -> None:
        """Grant first, then the driver's files, then create the nodes: no node appears
        that cannot be opened, nor before the libraries that use it."""
        v1 = self.grants.v1(record.v1_dir)
        adding = [rule_of(n) for n in pending if n.v1_added]
        if adding:
            assert v1 is not None
            v1.allow_all(adding)  # one read-back of devices.list for all the lines
        self.grants.grant_v2(record.v2_dir, [*record.nodes.values(), *pending])
        if place_driver is not None:
            place_driver()
            alive.check()
        for node_record in pending:
            node_record.created = fs.ensure(plan.node_of(node_record))
            if node_record.created:
                created.append(node_record)
        alive.check()

    def undo_mount(
        self,
        record: ContainerRecord,
        pending: list[NodeRecord],
        created: list[NodeRecord],
        fs: ContainerFs | None,
        undo_driver: Callable[[], object] | None = None,
    ) -> None:
        """Best effort, every step: the original error is what the caller must see.
        The nodes go first, then the driver's files, then the grants."""
        for node_record in created:
            if fs is not None:
                _quietly(fs.remove, plan.node_of(node_record))
        if undo_driver is not None:
            _quietly(undo_driver)
        v1 = self.grants.v1(record.v1_dir)
        for node_record in pending:
            if node_record.v1_added and v1 is not None:
                _quietly(v1.deny, rule_of(node_record))
        v2 = self.grants.v2(record.v2_dir)
        if v2 is not None:
            _quietly(v2.revoke, [rule_of(n) for n in pending if n.path not in record.nodes])
        record.pending = None
        _quietly(self.ledger.save, record)

    def apply_unmount(
        self,
        record: ContainerRecord,
        container: Container | None,
        driver_out: tuple[list[str], list[str]] | None = None,
    ) -> list[str]:
        """Roll an unmount forward: remove our nodes and driver files (reported in
        `driver_out`: removed, detached lazily), revoke our grants, drop the records."""
        assert record.pending is not None
        leaving = record.pending.nodes
        removed: list[str] = []
        if container is not None:
            with self.fs_of(container) as fs:
                for node_record in leaving:
                    if not node_record.created:
                        continue
                    try:
                        if fs.remove(plan.node_of(node_record)):
                            removed.append(node_record.path)
                    except UnsafePath as exc:
                        log.warning("leaving %s alone: %s", node_record.path, exc)
        if container is not None and record.pending.driver:  # after the nodes
            check = self.proven(record)
            gone_paths, lazily = self.driver.remove(container, record.pending.driver, check)
            if driver_out is not None:
                driver_out[0].extend(gone_paths)
                driver_out[1].extend(lazily)
            gone = {r.path for r in record.pending.driver}
            record.driver = [r for r in record.driver if r.path not in gone]
            if not record.driver:
                record.driver_env = {}
        elif container is None:
            record.driver = []
        v1 = self.grants.v1(record.v1_dir)
        if v1 is not None:
            with contextlib.suppress(ContainerNotFound):
                v1.deny_all([rule_of(n) for n in leaving if n.v1_added])
        v2 = self.grants.v2(record.v2_dir)
        if v2 is not None:
            with contextlib.suppress(ContainerNotFound):
                v2.revoke([rule_of(n) for n in leaving])
        for node_record in leaving:
            record.nodes.pop(node_record.path, None)
        for key in record.pending.devices:
            record.devices.pop(key, None)
            self.ledger.release(key, record.key)
        record.pending = None
        self.ledger.save(record)
        return removed

    def finish_pending(self, record: ContainerRecord, container: Container | None) -> None:
        """A previous process died midway: roll a mount back, an unmount forward."""
        assert record.pending is not None
        if record.pending.op == "unmount":
            self.apply_unmount(record, container)
            return
        fs_cm = self.fs_of(container) if container is not None else contextlib.nullcontext()
        undo_driver = None
        if container is not None and record.pending.driver:
            adding, check = record.pending.driver, self.proven(record)
            undo_driver = functools.partial(self.driver.remove, container, adding, check)
        with fs_cm as fs:
            maybe_created = [n for n in record.pending.nodes if n.created]
            for device in record.pending.devices:
                self.ledger.release(device, record.key)
            self.undo_mount(record, record.pending.nodes, maybe_created, fs, undo_driver)


def _quietly(fn: object, *args: object) -> None:
    try:
        fn(*args)  # type: ignore[operator]
    except Exception as exc:  # rollback must not hide the error that caused it
        log.warning("rollback step %s failed: %s", getattr(fn, "__name__", fn), exc)
