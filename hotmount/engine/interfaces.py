"""A mount that brings a network interface with its devices (`Engine.mount(netdev=...)`),
and the interfaces that no container record stands behind any more.

Checks first, then the devices (the engine's mount, with its own rollback), then the
interface; a failed move unmounts what this call mounted. Kept out of hotmount/engine/core.py,
which drives it, as hotmount/netdev/moves.py keeps the moves themselves; it uses the
engine's public API alone (hotmount/engine/surface.py), so it imports no engine back.
"""

from __future__ import annotations

import logging
from typing import Any

from hotmount.devices import companions
from hotmount.engine.results import MountResult, ReconcileReport
from hotmount.engine.surface import EngineSurface
from hotmount.errors import HotmountError
from hotmount.host.containers import Container, ContainerRef
from hotmount.netdev.plan import NetdevRefused, NetdevSpec

log = logging.getLogger(__name__)


def mount_with_netdev(
    engine: EngineSurface,
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


def check_owner(engine: EngineSurface, name: str, mounting: set[str], group: str) -> None:
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


def return_orphans(engine: EngineSurface, report: ReconcileReport) -> None:
    """Interfaces whose container no record stands behind any more (left by an agent
    before this rule, or by an unmount whose move back failed) go back too."""
    for container in sorted({r.container for r in engine.netdevs.records()}):
        with engine.ledger.lock(container):
            if engine.ledger.load(container) is not None:
                continue
            back, _ = engine.netdevs.release(container)
            report.netdevs += back
