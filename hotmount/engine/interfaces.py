"""A network interface as one step of a mount (`Engine.mount(netdev=...)`), and the
interfaces that no container record stands behind any more.

The same shape as the driver's files (hotmount/driver/steps.py): `plan` checks everything
before anything changes (the interface allowed and free, the addresses, an RDMA NIC's
interface only with its NIC); `apply` runs inside the mount's transaction, after its
nodes and grants, under the same container lock, and its own record
(`netdevs/<container>@<name>.json`, hotmount/netdev/moves.py) is written before the move,
with a phase reconcile finishes from; a failed move puts the interface back itself, and
the mount then undoes its nodes, grants and claims as for any failed step. Unmount takes
interfaces last (`Netdevs.leaving`). It uses the engine's public API alone
(hotmount/engine/surface.py), so it imports no engine back.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass

from hotmount.devices.model import Device
from hotmount.engine.results import ReconcileReport
from hotmount.engine.session import Session
from hotmount.engine.surface import EngineSurface
from hotmount.netdev.plan import NetdevRecord, NetdevRefused, NetdevSpec

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class InterfacePlan:
    """What `apply` moves: the host's interface `name`, as `spec` says, with the devices
    `with_devices` (its record names them: it goes back when the last of them leaves)."""

    spec: NetdevSpec
    name: str
    with_devices: list[str]


def plan(
    engine: EngineSurface,
    spec: NetdevSpec,
    devices: Iterable[Device],
    riders: Iterable[Device],
    group: str,
) -> InterfacePlan:
    """Check the move before anything changes. `riders`: the RDMA devices coming with the
    GPUs, whose interfaces `withNetdev` picks from when `spec` names none."""
    devices, riders = list(devices), list(riders)
    name = spec.name or engine.netdevs.choose(n for device in riders for n in device.netdevs)
    engine.netdevs.check(spec, name)
    keys = list(dict.fromkeys(d.key for d in [*devices, *riders]))
    check_owner(engine, name, set(keys), group)
    return InterfacePlan(spec, name, keys)


def apply(engine: EngineSurface, session: Session, planned: InterfacePlan) -> NetdevRecord:
    """Move it in (call under the container's lock, inside the mount's transaction)."""
    return engine.netdevs.attach(
        session.key,
        session.container.init_pid,
        session.start_time,
        planned.spec,
        planned.name,
        planned.with_devices,
    )


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
