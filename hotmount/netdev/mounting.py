"""A mount that brings a network interface with its devices (`Engine.mount(netdev=...)`),
and the interfaces that no container record stands behind any more.

Checks first, then the devices (the engine's mount, with its own rollback), then the
interface; a failed move unmounts what this call mounted. Kept out of hotmount/engine.py,
which drives it, as hotmount/netdev/moves.py keeps the moves themselves; it uses the
engine's public API alone (`Engine` below), so it imports no engine back.
"""

from __future__ import annotations

import logging
from contextlib import AbstractContextManager
from typing import Any, Protocol

from hotmount.containers import Container, ContainerRef
from hotmount.devices import companions
from hotmount.devices.inventory import Inventory
from hotmount.errors import HotmountError
from hotmount.ledger import Ledger
from hotmount.netdev.moves import Netdevs
from hotmount.netdev.plan import NetdevRefused, NetdevSpec
from hotmount.results import MountResult, ReconcileReport, UnmountResult
from hotmount.session import Session

log = logging.getLogger(__name__)


class Engine(Protocol):
    """What an interface's mount uses of hotmount/engine.py's Engine: its public API."""

    @property
    def inventory(self) -> Inventory: ...
    @property
    def ledger(self) -> Ledger: ...
    @property
    def netdevs(self) -> Netdevs: ...

    def resolve(self, ref: str | ContainerRef) -> Container: ...

    def session(
        self, ref: str | ContainerRef | Container, *, locked: bool = False
    ) -> AbstractContextManager[Session]: ...

    def mount(
        self,
        ref: Container,
        device_refs: list[str],
        force: bool = False,
        metadata: dict[str, str] | None = None,
        *,
        group: str | None = None,
        share_with: str | None = None,
        with_rdma: bool = False,
        rdma: list[str] | None = None,
        device_metadata: dict[str, dict[str, str]] | None = None,
        with_driver: bool | None = None,
    ) -> MountResult: ...

    def unmount(self, ref: Container, device_refs: list[str]) -> UnmountResult: ...


def mount_with_netdev(
    engine: Engine,
    ref: str | ContainerRef | Container,
    device_refs: list[str],
    spec: NetdevSpec,
    options: dict[str, Any],
) -> MountResult:
    devices = engine.inventory.resolve_all(device_refs)
    riders = companions.rdma_for(
        engine.inventory, devices, options["with_rdma"], options["rdma"] or ()
    )
    name = spec.name or engine.netdevs.choose(
        n for device, _ in riders.values() for n in device.netdevs
    )
    engine.netdevs.check(spec, name)
    container = ref if isinstance(ref, Container) else engine.resolve(ref)
    mounting = {d.key for d in devices} | set(riders)
    check_owner(engine, name, mounting, options["group"] or container.key)
    result = engine.mount(container, device_refs, **options)
    try:
        with engine.session(container, locked=True) as session:
            keys = [*(d.key for d in devices), *riders]
            engine.netdevs.attach(
                session.key, session.container.init_pid, session.start_time, spec, name, keys
            )
    except BaseException:
        if result.mounted:
            try:
                engine.unmount(container, [m.key for m in result.mounted])
            except HotmountError as exc:
                log.warning("rollback after the interface move failed: %s", exc.message)
        raise
    result.netdevs = [name]
    return result


def check_owner(engine: Engine, name: str, mounting: set[str], group: str) -> None:
    """An RDMA NIC's interface goes only with that NIC: in this mount, or already held
    by the caller's group; else naming it would take it from whoever holds the NIC."""
    for device in engine.inventory.rdma_devices():
        if name not in device.netdevs or device.key in mounting:
            continue
        held = any(c.device == device.key and c.group == group for c in engine.ledger.claims())
        if not held:
            raise NetdevRefused(
                f"interface {name} belongs to RDMA device {device.key}: mount it with "
                "that device (rdma or withRdma), or hold the device already"
            )


def return_orphans(engine: Engine, report: ReconcileReport) -> None:
    """Interfaces whose container no record stands behind any more (left by an agent
    before this rule, or by an unmount whose move back failed) go back too."""
    for container in sorted({r.container for r in engine.netdevs.records()}):
        with engine.ledger.lock(container):
            if engine.ledger.load(container) is not None:
                continue
            back, _ = engine.netdevs.release(container)
            report.netdevs += back
