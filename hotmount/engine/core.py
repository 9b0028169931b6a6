"""The engine: mount, unmount, status and reconcile for one container at a time.

Order for mount: validate everything, claim the devices, write the plan as
pending, grant the cgroup, place the driver's files, then create the nodes, so
that no node appears that cannot be opened or before its libraries; for unmount:
check use, remove the nodes, the driver's files, then revoke. Every step is
idempotent and a failure rolls back what the operation did. The engine holds the
locks, claims and records; the kernel steps are hotmount/engine/steps.py's, the use
check hotmount/engine/inuse.py's.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from dataclasses import replace

from hotmount.cgroups.detect import CgroupLayout, detect
from hotmount.config import EngineConfig
from hotmount.devices import companions
from hotmount.devices.inventory import Inventory
from hotmount.devices.model import Device
from hotmount.driver.injection import DriverInjection
from hotmount.engine import interfaces, plan
from hotmount.engine.grants import CgroupGrants
from hotmount.engine.inuse import UseCheck
from hotmount.engine.reconcile import repair_drift, sweep_claims
from hotmount.engine.results import (
    ContainerStatus,
    MountedDevice,
    MountResult,
    ReconcileReport,
    UnmountResult,
)
from hotmount.engine.session import Session, Sessions
from hotmount.engine.status import container_status
from hotmount.engine.steps import NodeSteps
from hotmount.engine.suspension import Suspender
from hotmount.engine.view import Mounts
from hotmount.errors import HotmountError
from hotmount.host.containers import Container, ContainerRef, ContainerResolver
from hotmount.host.liveness import Liveness
from hotmount.hostfs import HostRoot
from hotmount.netdev.moves import Netdevs
from hotmount.netdev.plan import NetdevSpec
from hotmount.state import claims
from hotmount.state.claims import Claim, Workload
from hotmount.state.ledger import ContainerRecord, DeviceRecord, Ledger, NodeRecord, PendingOp, now
from hotmount.tenantfs.devnodes import ContainerFs, open_container_fs

log = logging.getLogger(__name__)


class Engine:
    def __init__(self, config: EngineConfig | None = None) -> None:
        self.config = config or EngineConfig()
        self.host = HostRoot(self.config.host_root)
        self.driver_host = HostRoot(self.config.driver_host_root or self.config.host_root)
        self.layout: CgroupLayout = detect(self.host)
        self.resolver = ContainerResolver(self.host, self.layout)
        # Strings for the per-operation paths and comparisons (pathlib costs more).
        self._proc = os.fspath(self.host.proc)
        self.grants = CgroupGrants(self.layout)
        self.ledger = Ledger(self.config.state_dir)
        self.sessions = Sessions(self.resolver, self._proc, self.ledger)
        self.mounts = Mounts(self.ledger)  # the books, read-only: for the agent and the CLI
        self.netdevs = Netdevs(
            self.host,
            self.config.state_dir,
            self.config.netdev_allow,
            address_cidrs=self.config.netdev_address_cidrs,
        )
        self.driver = DriverInjection(
            self._proc,
            self.host,
            self.driver_host,
            self.config.cdi_dirs,
            self.config.driver_root,
            self.config.inject_driver,
        )
        self.use = UseCheck(self.host.proc, self.config.use_nvml, self.config.stop_grace)
        self.steps = NodeSteps(
            self.grants, self.ledger, self.driver, self._fs, self.sessions.proven
        )
        self.inventory = self.load_inventory()
        self.suspender = Suspender(self)  # suspend and resume: hotmount/suspend/

    def load_inventory(self) -> Inventory:
        sys_host = HostRoot(self.config.sys_root) if self.config.sys_root else None
        self.inventory = Inventory.load(
            self.host, self.config.cdi_dirs, self.config.use_nvml, sys_host=sys_host
        )
        return self.inventory

    def resolve(self, ref: str | ContainerRef) -> Container:
        return self.resolver.resolve(ref)

    def session(
        self, ref: str | ContainerRef | Container, *, locked: bool = False
    ) -> contextlib.AbstractContextManager[Session]:
        """The container, resolved and pinned by a pidfd for the block (with its record
        and lock): the door hotmount/suspend/ and hotmount/netdev/ use
        (hotmount/engine/session.py)."""
        return self.sessions.open(ref, locked=locked)

    def holders(self) -> dict[str, list[Claim]]:
        """Inventory key -> every claim on the same physical device, under whatever name
        (GPU 0 is held when `=all`, `=GPU-<uuid>` or one of its MIG instances is)."""
        every = self.ledger.claims()
        out: dict[str, list[Claim]] = {}
        for device in self.inventory.devices:
            mine = self.inventory.footprint(device)
            found = [c for c in every if c.footprint.overlaps(mine)]
            if found:
                out[device.key] = found
        return out

    # -- mount
    def mount(
        self,
        ref: str | ContainerRef | Container,
        device_refs: list[str],
        force: bool = False,
        metadata: dict[str, str] | None = None,
        *,
        group: str | None = None,
        share_with: str | None = None,
        with_rdma: bool = False,
        rdma: list[str] | None = None,
        netdev: NetdevSpec | None = None,
        device_metadata: dict[str, dict[str, str]] | None = None,
        with_driver: bool | None = None,
        workload: Workload | None = None,
    ) -> MountResult:
        """Mount `device_refs` into one container.

        `metadata`: the caller's labels, kept with each device and never read here.
        `workload`: whom the devices are for, named when another is refused them.

        `group`: who may share these devices without asking (a pod: several of its
        containers); default the container alone. `share_with`: a group whose hold on
        the same physical devices this mount joins on purpose (hotmount/state/claims.py).
        `with_rdma`, `rdma`: RDMA devices that come and go with these GPUs
        (hotmount/devices/companions.py). `netdev`: an interface moved into the container's
        network namespace with them (hotmount/netdev/moves.py). `device_metadata`: more
        metadata for some devices, by key (each GPU's own pin). `with_driver`: bring the
        driver's files too (hotmount/driver/); None takes the engine's `inject_driver`.
        """
        devices = self.inventory.resolve_all(device_refs)
        riders = companions.rdma_for(self.inventory, devices, with_rdma, rdma or ())
        devices += [device for device, _ in riders.values()]
        with self.session(ref, locked=True) as session:
            container, alive, record = session.container, session.alive, session.record()
            if record.pending is not None:
                self.steps.finish_pending(record, container)
            new = [d for d in devices if d.key not in record.devices]
            already = [_mounted(d) for d in devices if d.key in record.devices]
            group = group or container.key
            interface = None
            if netdev is not None:  # checked whole before anything changes
                rdma_riders = [device for device, _ in riders.values()]
                interface = interfaces.plan(self, netdev, devices, rdma_riders, group)
            companions.note(record, riders)
            adding_driver = self.driver.adding(container, devices, record, with_driver, alive.check)
            with adding_driver as driver:
                if not new and driver is None and interface is None:
                    if riders:
                        self.ledger.save(record)
                    return MountResult(container.as_dict(), [], already)
                with self._fs(container, alive) as fs:
                    pending = self.steps.plan(record, new, fs)
                    adding = driver.records if driver is not None else []
                    # The plan goes on disk before the claims: another container that finds
                    # our claim then also finds our record, and never mistakes it for stale.
                    record.pending = PendingOp(
                        op="mount", devices=[d.key for d in new], nodes=pending, driver=adding
                    )
                    self.ledger.save(record)
                    created: list[NodeRecord] = []
                    try:
                        joined = self._claim(new, container.key, force, group, share_with, workload)
                        place = driver.place if driver is not None else None
                        self.steps.apply_mount(record, pending, created, fs, alive, place)
                        if interface is not None:  # last: a failed move puts it back itself
                            interfaces.apply(self, session, interface)
                    except BaseException:
                        for device in new:
                            self.ledger.release(device.key, container.key)
                        undo = driver.undo if driver is not None else None
                        self.steps.undo_mount(record, pending, created, fs, undo)
                        raise
            for node_record in pending:
                record.nodes[node_record.path] = node_record
            for device in new:
                record.devices[device.key] = DeviceRecord(
                    key=device.key,
                    kind=str(device.kind),
                    node_paths=[n.path for n in device.all_nodes],
                    mounted_at=now(),
                    metadata={**(metadata or {}), **(device_metadata or {}).get(device.key, {})},
                    workload=workload,
                    group=group,
                    shared_with=joined.get(device.key),
                    with_devices=riders[device.key][1] if device.key in riders else [],
                )
            summary = None
            if driver is not None:
                record.driver += adding
                record.driver_env = {**record.driver_env, **driver.plan.env}
                summary = driver.summary()
            record.pending = None
            self.ledger.save(record)
            log.info("mounted %s into %s", [d.key for d in new], container.key)
            mounted = [_mounted(d) for d in new]
            result = MountResult(container.as_dict(), mounted, already, driver=summary)
            result.netdevs = [interface.name] if interface is not None else []
            return result

    def _claim(
        self,
        devices: list[Device],
        owner: str,
        force: bool,
        group: str,
        share_with: str | None,
        workload: Workload | None,
    ) -> dict[str, str | None]:
        """Claim the physical devices behind `devices`, or raise DeviceClaimed naming who
        holds them. Returns the `shared_with` each claim recorded."""
        with self.ledger.claims_lock():
            existing = self.ledger.claims()
            wanted = []
            for device in devices:
                claim = Claim(owner, device.key, group, self.inventory.footprint(device))
                joined = claims.joined(claim, existing, share_with) if not force else None
                wanted.append(replace(claim, shared_with=joined, holder=workload))
            if not force:
                for claim in wanted:
                    blockers = claims.blocking(claim, existing, share_with)
                    stale = {b.owner for b in blockers if not self.sessions.record_alive(b.owner)}
                    for dead in stale:  # its container is gone: its claims are void
                        for c in existing:
                            if c.owner == dead and not c.footprint.unknown:
                                self.ledger.release(c.device, dead)
                        self.ledger.release_unreadable(dead)
                    existing = [c for c in existing if c.owner not in stale]
                    live = [b for b in blockers if b.owner not in stale]
                    if live:
                        raise claims.claimed_error(self.inventory.get(claim.device), live)
            self.ledger.add_claims(wanted)
        return {c.device: c.shared_with for c in wanted}

    # -- unmount
    def unmount(
        self,
        ref: str | ContainerRef | Container,
        device_refs: list[str] | None = None,
        force: bool = False,
        *,
        spare_staying: bool = True,
    ) -> UnmountResult:
        """`force` stops the leaving devices' holders; with `spare_staying` (the default)
        never one that also uses a device that stays (HeldWithStayingDevices). A take-back
        (the books are wrong: the GPU is another pod's) passes False.

        `force` never depends on a complete look at the container's open files: where it
        cannot finish (a flood of fds, a filesystem that does not answer), the device is
        revoked and its nodes removed anyway, then its holders and the processes the
        look could not clear are stopped (`unclassified_pids`, `unclassified_why`).
        Without `force` that is ScanIncomplete, and nothing changes."""
        with self.session(ref, locked=True) as session:
            container, record = session.container, session.record()
            if record.pending is not None:
                self.steps.finish_pending(record, container)
            keys = companions.leaving_with(record, self._keys(record, device_refs))
            targets = [k for k in keys if k in record.devices]
            missing = [k for k in keys if k not in record.devices]
            if not targets:
                return UnmountResult(container.as_dict(), [], missing, [], [])
            leaving = plan.nodes_to_remove(record, targets)
            with self.use.clear(
                self.inventory, container, record, targets, leaving, force, spare_staying
            ) as cleared:
                staying = [k for k in record.devices if k not in targets]
                record.pending = PendingOp(
                    op="unmount",
                    devices=targets,
                    nodes=leaving,
                    driver=record.driver if not staying else [],
                )
                self.ledger.save(record)
                driver_removed: list[str] = []
                driver_detached: list[str] = []
                removed = self.steps.apply_unmount(
                    record, container, (driver_removed, driver_detached)
                )
                # A forced unmount whose look at open files could not finish stops its
                # processes now, with the device revoked and its nodes gone.
                cleared.after_revoke()
            # Interfaces last: nodes gone and grants revoked first, no window between
            # the in-use check and the revoke.
            returned = self.netdevs.leaving(container.key, staying)
            unclassified = sorted({h.pid for h in cleared.unclassified} | set(cleared.swept))
            if unclassified:
                log.warning(
                    "unmounted %s from %s without a complete look at its open files (%s): "
                    "stopped PIDs %s, which it could not clear, after the revoke",
                    targets,
                    container.key,
                    cleared.why,
                    ", ".join(map(str, cleared.stopped)),
                )
            else:
                log.info("unmounted %s from %s", targets, container.key)
            return UnmountResult(
                container.as_dict(),
                targets,
                missing,
                cleared.stopped,
                removed,
                returned,
                driver_removed=driver_removed,
                driver_detached=driver_detached,
                unclassified_pids=unclassified,
                unclassified_why=cleared.why,
            )

    def _keys(self, record: ContainerRecord, refs: list[str] | None) -> list[str]:
        if refs is None:
            return list(record.devices)
        keys = []
        for ref in refs:
            if ref in record.devices:  # also devices that left the inventory since
                keys.append(ref)
                continue
            keys.append(self.inventory.resolve(ref).key)
        return list(dict.fromkeys(keys))

    # -- status
    def status(self, ref: str | ContainerRef | Container) -> ContainerStatus:
        container = ref if isinstance(ref, Container) else self.resolve(ref)
        record = self.ledger.load(container.key)
        if record is None:
            return ContainerStatus(container.key, container.id, container.init_pid, True, [], None)
        return self._status_of(record, container)

    def statuses(self) -> list[ContainerStatus]:
        return [self._status_of(r, self.sessions.live(r)) for r in self.ledger.records()]

    def _status_of(self, record: ContainerRecord, container: Container | None) -> ContainerStatus:
        return container_status(record, container, self.grants, self._fs)

    # -- reconcile
    def reconcile(self, *, suspensions: bool = True) -> ReconcileReport:
        """Repair what drifted. `suspensions`: also finish or roll back the suspensions a
        crash left part-way, last (after the pending operations, a suspension's unmount
        among them); the agent does that beside its pass instead (`Suspender.repair`), as
        a restore may take minutes."""
        report = ReconcileReport()
        for stale in self.ledger.records():
            with self.ledger.lock(stale.key):
                record = self.ledger.load(stale.key)
                if record is None:
                    continue
                report.checked += 1
                try:
                    self._reconcile_one(record, report)
                except HotmountError as exc:
                    report.errors[record.key] = exc.message
                    log.warning("reconcile %s: %s", record.key, exc.message)
        interfaces.return_orphans(self, report)
        sweep_claims(self.ledger, self.inventory)
        report.netdevs += self.netdevs.reconcile(self.ledger.lock)
        if suspensions:
            self.suspender.reconcile(report)  # after the pending ops: a suspension's unmount
        return report

    def _reconcile_one(self, record: ContainerRecord, report: ReconcileReport) -> None:
        container = self.sessions.live(record)
        if container is None:
            # A NIC's claim and its interface go together: the interface back to the host
            # first (a restarted container's pod keeps the namespace, and the interface
            # in it); while one stays out, so do the record and its devices' claims.
            back, out = self.netdevs.release(record.key)
            report.netdevs += back
            if out:
                names = ", ".join(r.host_name for r in out)
                log.info(
                    "keeping %s's claims until its interfaces (%s) are back", record.key, names
                )
                return
            for key in record.devices:
                self.ledger.release(key, record.key)
            self.ledger.delete(record.key)
            report.forgotten.append(record.key)
            log.info("forgot %s: the container is gone", record.key)
            return
        if record.pending is not None:
            self.steps.finish_pending(record, container)
            report.pending_finished += 1
        with self._fs(container) as fs:
            repair_drift(record, self.grants, fs, report)
        if record.driver:
            report.recreated += self.driver.repair(
                container, record.driver, self.sessions.proven(record)
            )
        self.ledger.save(record)

    # -- helpers
    @contextlib.contextmanager
    def _fs(self, container: Container, alive: Liveness | None = None) -> Iterator[ContainerFs]:
        """The container's device nodes; through `alive`'s pin where the session has one."""
        process = alive.pinned_process() if alive is not None else None
        fs = open_container_fs(self._proc, container, self.config.node_method, process)
        try:
            yield fs
        finally:
            fs.close()


def _mounted(device: Device) -> MountedDevice:
    return MountedDevice(
        device.key, str(device.kind), device.index, device.uuid, [n.path for n in device.nodes]
    )
