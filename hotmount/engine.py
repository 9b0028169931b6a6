"""The engine: mount, unmount, status and reconcile for one container at a time.

Order for mount: validate everything, claim the devices, write the plan as
pending, grant the cgroup, then create the nodes, so that no node appears that
cannot be opened; for unmount: check use, remove the nodes, then revoke. Every
step is idempotent and a failure rolls back what the operation did.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from hotmount import claims, companions, plan, usage
from hotmount.cgroups.detect import CgroupLayout, detect
from hotmount.cgroups.v1 import V1Devices, allows
from hotmount.cgroups.v2 import V2Devices
from hotmount.claims import Claim
from hotmount.containers import (
    CgroupPaths,
    Container,
    ContainerRef,
    ContainerResolver,
    parse_container_ref,
    parse_proc_cgroup,
    read_pids_file,
)
from hotmount.devices.inventory import DEFAULT_CDI_DIRS, Inventory
from hotmount.devices.model import Device, DeviceRule
from hotmount.devnodes import ContainerFs, NodeState, open_container_fs
from hotmount.errors import (
    ContainerNotFound,
    DeviceBusy,
    DeviceClaimed,
    Holder,
    HotmountError,
    NotInContainer,
    UnsafePath,
)
from hotmount.hostfs import HostRoot
from hotmount.ledger import ContainerRecord, DeviceRecord, Ledger, NodeRecord, PendingOp, now
from hotmount.netdev_plan import NetdevRefused, NetdevSpec
from hotmount.netdevs import Netdevs

log = logging.getLogger(__name__)

DEFAULT_STATE_DIR = Path("/run/gpu-hotmount/state")  # tmpfs: as long-lived as the kernel state


@dataclass(frozen=True)
class EngineConfig:
    host_root: Path = Path("/")
    cdi_dirs: tuple[str, ...] = DEFAULT_CDI_DIRS
    state_dir: Path = DEFAULT_STATE_DIR
    use_nvml: bool = True
    node_method: str = "auto"  # auto | openat2 | setns
    stop_grace: float = 10.0
    sys_root: Path | None = None  # where /sys is read for RDMA and PCIe places (default: host)
    netdev_allow: tuple[str, ...] = ()  # interfaces (names, globs) that may move; empty: none


@dataclass
class MountedDevice:
    key: str
    kind: str
    index: int | None
    uuid: str | None
    paths: list[str]


@dataclass
class MountResult:
    container: dict[str, object]
    mounted: list[MountedDevice]
    already_mounted: list[MountedDevice]
    netdevs: list[str] = field(default_factory=list)  # host interfaces moved in

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


@dataclass
class UnmountResult:
    container: dict[str, object]
    unmounted: list[str]
    not_mounted: list[str]
    stopped_pids: list[int]
    removed_nodes: list[str]
    netdevs: list[str] = field(default_factory=list)  # host interfaces given back

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


@dataclass
class NodeStatus:
    path: str
    major: int
    minor: int
    state: str
    granted: bool
    created_by_us: bool


@dataclass
class DeviceStatus:
    key: str
    kind: str
    mounted_at: str
    metadata: dict[str, str]
    nodes: list[NodeStatus]


@dataclass
class ContainerStatus:
    key: str
    container_id: str | None
    init_pid: int
    running: bool
    devices: list[DeviceStatus]
    pending: str | None

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


@dataclass
class ReconcileReport:
    checked: int = 0
    regranted: int = 0
    rewrapped: int = 0
    recreated: int = 0
    pending_finished: int = 0
    forgotten: list[str] = field(default_factory=list)
    errors: dict[str, str] = field(default_factory=dict)
    netdevs: list[str] = field(default_factory=list)  # interfaces restored or forgotten

    @property
    def repairs(self) -> int:
        return self.regranted + self.rewrapped + self.recreated + self.pending_finished

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


class Engine:
    def __init__(self, config: EngineConfig | None = None) -> None:
        self.config = config or EngineConfig()
        self.host = HostRoot(self.config.host_root)
        self.layout: CgroupLayout = detect(self.host)
        self.resolver = ContainerResolver(self.host, self.layout)
        # Strings for the per-operation paths and comparisons (pathlib costs more).
        self._proc = os.fspath(self.host.proc)
        self._v1_root = _normpath(self.layout.v1_devices_root)
        self._v2_root = _normpath(self.layout.v2_root)
        self._v1_dirs: dict[str, V1Devices | None] = {}
        self._v2_dirs: dict[str, V2Devices | None] = {}
        self.ledger = Ledger(self.config.state_dir)
        self.netdevs = Netdevs(self.host, self.config.state_dir, self.config.netdev_allow)
        self.inventory = self.load_inventory()

    def load_inventory(self) -> Inventory:
        sys_host = HostRoot(self.config.sys_root) if self.config.sys_root else None
        self.inventory = Inventory.load(
            self.host, self.config.cdi_dirs, self.config.use_nvml, sys_host=sys_host
        )
        return self.inventory

    def resolve(self, ref: str | ContainerRef) -> Container:
        return self.resolver.resolve(ref)

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
    ) -> MountResult:
        """Mount `device_refs` into one container.

        `group`: who may share these devices without asking (a pod: several of its
        containers); default the container alone. `share_with`: a group whose hold on
        the same physical devices this mount joins on purpose (hotmount/claims.py).
        `with_rdma`, `rdma`: RDMA devices that come and go with these GPUs
        (hotmount/companions.py). `netdev`: an interface moved into the container's
        network namespace with them (hotmount/netdevs.py).
        """
        if netdev is not None:
            options = {"force": force, "metadata": metadata, "group": group}
            options |= {"share_with": share_with, "with_rdma": with_rdma, "rdma": rdma}
            return self._mount_with_netdev(ref, device_refs, netdev, options)
        devices = self.inventory.resolve_all(device_refs)
        riders = companions.rdma_for(self.inventory, devices, with_rdma, rdma or ())
        devices += [device for device, _ in riders.values()]
        container, alive = self._enter(ref)
        with alive, self.ledger.lock(container.key):
            record = self._record_for(container, alive.start_time)
            if record.pending is not None:
                self._finish_pending(record, container)
            new = [d for d in devices if d.key not in record.devices]
            already = [_mounted(d) for d in devices if d.key in record.devices]
            companions.note(record, riders)
            if not new:
                if riders:
                    self.ledger.save(record)
                return MountResult(container.as_dict(), [], already)
            with self._fs(container) as fs:
                pending = self._plan(record, new, fs)
                # The plan goes on disk before the claims: another container that finds
                # our claim then also finds our record, and never mistakes it for stale.
                record.pending = PendingOp(op="mount", devices=[d.key for d in new], nodes=pending)
                self.ledger.save(record)
                created: list[NodeRecord] = []
                group = group or container.key
                try:
                    joined = self._claim(new, container.key, force, group, share_with, metadata)
                    self._apply_mount(record, pending, created, fs, alive)
                except BaseException:
                    for device in new:
                        self.ledger.release(device.key, container.key)
                    self._undo_mount(record, pending, created, fs)
                    raise
            for node_record in pending:
                record.nodes[node_record.path] = node_record
            for device in new:
                record.devices[device.key] = DeviceRecord(
                    key=device.key,
                    kind=str(device.kind),
                    node_paths=[n.path for n in device.all_nodes],
                    mounted_at=now(),
                    metadata=metadata or {},
                    group=group,
                    shared_with=joined.get(device.key),
                    with_devices=riders[device.key][1] if device.key in riders else [],
                )
            record.pending = None
            self.ledger.save(record)
            log.info("mounted %s into %s", [d.key for d in new], container.key)
            return MountResult(container.as_dict(), [_mounted(d) for d in new], already)

    def _claim(
        self,
        devices: list[Device],
        owner: str,
        force: bool,
        group: str,
        share_with: str | None,
        metadata: dict[str, str] | None,
    ) -> dict[str, str | None]:
        """Claim the physical devices behind `devices`, or raise DeviceClaimed naming who
        holds them. Returns the `shared_with` each claim recorded."""
        holder = {k: v for k, v in (metadata or {}).items() if k in _HOLDER_KEYS}
        with self.ledger.claims_lock():
            existing = self.ledger.claims()
            wanted = []
            for device in devices:
                claim = Claim(owner, device.key, group, self.inventory.footprint(device))
                joined = claims.joined(claim, existing, share_with) if not force else None
                wanted.append(replace(claim, shared_with=joined, holder=holder))
            if not force:
                for claim in wanted:
                    blockers = claims.blocking(claim, existing, share_with)
                    stale = {b.owner for b in blockers if not self._record_alive(b.owner)}
                    for dead in stale:  # its container is gone: its claims are void
                        for c in existing:
                            if c.owner == dead and not c.footprint.unknown:
                                self.ledger.release(c.device, dead)
                        self.ledger.release_unreadable(dead)
                    existing = [c for c in existing if c.owner not in stale]
                    live = [b for b in blockers if b.owner not in stale]
                    if live:
                        raise _claimed(self.inventory.get(claim.device), live)
            self.ledger.add_claims(wanted)
        return {c.device: c.shared_with for c in wanted}

    def _plan(
        self, record: ContainerRecord, new: list[Device], fs: ContainerFs
    ) -> list[NodeRecord]:
        """Read-only: which nodes to add, refusing paths held by something else."""
        v1 = self._v1(record.v1_dir)
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

    def _apply_mount(
        self,
        record: ContainerRecord,
        pending: list[NodeRecord],
        created: list[NodeRecord],
        fs: ContainerFs,
        alive: _Liveness,
    ) -> None:
        """Grant first, then create the nodes: no node appears that cannot be opened."""
        v1 = self._v1(record.v1_dir)
        adding = [_rule(n) for n in pending if n.v1_added]
        if adding:
            assert v1 is not None
            v1.allow_all(adding)  # one read-back of devices.list for all the lines
        self._v2_grant(record.v2_dir, [*record.nodes.values(), *pending])
        for node_record in pending:
            node_record.created = fs.ensure(plan.node_of(node_record))
            if node_record.created:
                created.append(node_record)
        alive.check()

    def _undo_mount(
        self,
        record: ContainerRecord,
        pending: list[NodeRecord],
        created: list[NodeRecord],
        fs: ContainerFs | None,
    ) -> None:
        """Best effort, every step: the original error is what the caller must see."""
        for node_record in created:
            if fs is not None:
                _quietly(fs.remove, plan.node_of(node_record))
        v1 = self._v1(record.v1_dir)
        for node_record in pending:
            if node_record.v1_added and v1 is not None:
                _quietly(v1.deny, _rule(node_record))
        v2 = self._v2(record.v2_dir)
        if v2 is not None:
            _quietly(v2.revoke, [_rule(n) for n in pending if n.path not in record.nodes])
        record.pending = None
        _quietly(self.ledger.save, record)

    # -- unmount
    def unmount(
        self,
        ref: str | ContainerRef | Container,
        device_refs: list[str] | None = None,
        force: bool = False,
    ) -> UnmountResult:
        container, alive = self._enter(ref)
        with alive, self.ledger.lock(container.key):
            record = self._record_for(container, alive.start_time)
            if record.pending is not None:
                self._finish_pending(record, container)
            keys = companions.leaving_with(record, self._keys(record, device_refs))
            targets = [k for k in keys if k in record.devices]
            missing = [k for k in keys if k not in record.devices]
            if not targets:
                return UnmountResult(container.as_dict(), [], missing, [], [])
            leaving = plan.nodes_to_remove(record, targets)
            stopped = self._check_use(container, record, targets, leaving, force)
            staying = [k for k in record.devices if k not in targets]
            record.pending = PendingOp(op="unmount", devices=targets, nodes=leaving)
            self.ledger.save(record)
            removed = self._apply_unmount(record, container)
            # Interfaces last: nodes gone and grants revoked first, no window between
            # the in-use check and the revoke.
            returned = self.netdevs.leaving(container.key, staying)
            log.info("unmounted %s from %s", targets, container.key)
            return UnmountResult(container.as_dict(), targets, missing, stopped, removed, returned)

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

    def _check_use(
        self,
        container: Container,
        record: ContainerRecord,
        targets: list[str],
        leaving: list[NodeRecord],
        force: bool,
    ) -> list[int]:
        numbers = {(n.major, n.minor) for n in leaving}
        for key in targets:
            for path in record.devices[key].node_paths:
                if path in record.nodes:
                    numbers.add((record.nodes[path].major, record.nodes[path].minor))
        # pidfds first, then the scan, then signals through the pidfds: a holder that
        # exits meanwhile cannot pass its signal on to whoever gets its PID next.
        with usage.Pinned.pin(container.pids) as pinned:
            found = self._holders(pinned, targets, numbers)
            if not found:
                return []
            if not force:
                names = ", ".join(f"PID {h.pid} ({h.command}) holds {h.path}" for h in found)
                raise DeviceBusy(
                    f"the device is in use in container {container.key}: {names}", found
                )
            stopped = pinned.stop({h.pid for h in found}, self.config.stop_grace)
        with usage.Pinned.pin(container.pids) as again:
            still = self._holders(again, targets, numbers)
        if still:
            raise DeviceBusy("processes still hold the device after SIGKILL", still)
        return stopped

    def _holders(
        self, pinned: usage.Pinned, targets: list[str], numbers: set[tuple[int, int]]
    ) -> list[Holder]:
        found = pinned.holders(self.host.proc, numbers)
        uuids = [d.uuid for k in targets if (d := self.inventory.get(k)) and d.uuid]
        nvml = usage.nvml_pids(uuids) if self.config.use_nvml else set()
        extra = (nvml & set(pinned.pids)) - {h.pid for h in found}
        found += [Holder(pid, usage.comm(self.host.proc, pid), "(NVML)") for pid in extra]
        return found

    def _apply_unmount(self, record: ContainerRecord, container: Container | None) -> list[str]:
        """Roll an unmount forward: remove our nodes, revoke our grants, drop the records."""
        assert record.pending is not None
        leaving = record.pending.nodes
        removed = []
        if container is not None:
            with self._fs(container) as fs:
                for node_record in leaving:
                    if not node_record.created:
                        continue
                    try:
                        if fs.remove(plan.node_of(node_record)):
                            removed.append(node_record.path)
                    except UnsafePath as exc:
                        log.warning("leaving %s alone: %s", node_record.path, exc)
        v1 = self._v1(record.v1_dir)
        if v1 is not None:
            with contextlib.suppress(ContainerNotFound):
                v1.deny_all([_rule(n) for n in leaving if n.v1_added])
        v2 = self._v2(record.v2_dir)
        if v2 is not None:
            with contextlib.suppress(ContainerNotFound):
                v2.revoke([_rule(n) for n in leaving])
        for node_record in leaving:
            record.nodes.pop(node_record.path, None)
        for key in record.pending.devices:
            record.devices.pop(key, None)
            self.ledger.release(key, record.key)
        record.pending = None
        self.ledger.save(record)
        return removed

    def _finish_pending(self, record: ContainerRecord, container: Container | None) -> None:
        """A previous process died midway: roll a mount back, an unmount forward."""
        assert record.pending is not None
        if record.pending.op == "unmount":
            self._apply_unmount(record, container)
            return
        fs_cm = self._fs(container) if container is not None else contextlib.nullcontext()
        with fs_cm as fs:
            maybe_created = [n for n in record.pending.nodes if n.created]
            for device in record.pending.devices:
                self.ledger.release(device, record.key)
            self._undo_mount(record, record.pending.nodes, maybe_created, fs)

    # -- status
    def status(self, ref: str | ContainerRef | Container) -> ContainerStatus:
        container = ref if isinstance(ref, Container) else self.resolve(ref)
        record = self.ledger.load(container.key)
        if record is None:
            return ContainerStatus(container.key, container.id, container.init_pid, True, [], None)
        return self._status(record, container)

    def statuses(self) -> list[ContainerStatus]:
        return [self._status(r, self._live(r)) for r in self.ledger.records()]

    def _status(self, record: ContainerRecord, container: Container | None) -> ContainerStatus:
        v1, v2 = self._v1(record.v1_dir), self._v2(record.v2_dir)
        v2_grants: frozenset[DeviceRule] | None = None
        if container is not None and v2 is not None:
            with contextlib.suppress(ContainerNotFound):
                state = v2.state()
                v2_grants = state.grants if state.restricted else None
        node_status: dict[str, NodeStatus] = {}
        fs_cm = self._fs(container) if container is not None else contextlib.nullcontext()
        with fs_cm as fs:
            for path, node_record in record.nodes.items():
                rule = _rule(node_record)
                state = fs.state(plan.node_of(node_record)).value if fs else "unknown"
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

    # -- reconcile
    def reconcile(self) -> ReconcileReport:
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
        self._sweep_claims()
        report.netdevs = self.netdevs.reconcile(self.ledger.lock)
        return report

    def _mount_with_netdev(
        self,
        ref: str | ContainerRef | Container,
        device_refs: list[str],
        spec: NetdevSpec,
        options: dict[str, Any],
    ) -> MountResult:
        """Checks first, then the devices (with their own rollback), then the interface;
        a failed move unmounts what this call mounted."""
        devices = self.inventory.resolve_all(device_refs)
        riders = companions.rdma_for(
            self.inventory, devices, options["with_rdma"], options["rdma"] or ()
        )
        name = spec.name or self.netdevs.choose(
            n for device, _ in riders.values() for n in device.netdevs
        )
        self.netdevs.check(spec, name)
        container = ref if isinstance(ref, Container) else self.resolve(ref)
        mounting = {d.key for d in devices} | set(riders)
        self._check_netdev_owner(name, mounting, options["group"] or container.key)
        result = self.mount(container, device_refs, **options)
        try:
            container, alive = self._enter(container)
            with alive, self.ledger.lock(container.key):
                keys = [*(d.key for d in devices), *riders]
                self.netdevs.attach(
                    container.key, container.init_pid, alive.start_time, spec, name, keys
                )
        except BaseException:
            if result.mounted:
                try:
                    self.unmount(container, [m.key for m in result.mounted])
                except HotmountError as exc:
                    log.warning("rollback after the interface move failed: %s", exc.message)
            raise
        result.netdevs = [name]
        return result

    def _check_netdev_owner(self, name: str, mounting: set[str], group: str) -> None:
        """An RDMA NIC's interface goes only with that NIC: in this mount, or already held
        by the caller's group; else naming it would take it from whoever holds the NIC."""
        for device in self.inventory.rdma_devices():
            if name not in device.netdevs or device.key in mounting:
                continue
            held = any(c.device == device.key and c.group == group for c in self.ledger.claims())
            if not held:
                raise NetdevRefused(
                    f"interface {name} belongs to RDMA device {device.key}: mount it with "
                    "that device (rdma or withRdma), or hold the device already"
                )

    def _sweep_claims(self) -> None:
        """Drop claims no record stands behind; rewrite unreadable ones from the record.

        A mount writes its record before its claim: so a claim read first, then no
        record, is stale (a record list taken before the claims would miss a mount
        that landed in between, and free the device it had just claimed).
        """
        with self.ledger.claims_lock():
            self.ledger.sweep_temp_claims()
        for owner in sorted({c.owner for c in self.ledger.claims()}):
            with self.ledger.lock(owner), self.ledger.claims_lock():
                record = self.ledger.load(owner)
                mine = [c for c in self.ledger.claims() if c.owner == owner]
                wanted = set(record.devices) if record else set()
                if record is not None and record.pending and record.pending.op == "mount":
                    wanted |= set(record.pending.devices)
                for claim in mine:
                    if not claim.footprint.unknown and claim.device not in wanted:
                        self.ledger.release(claim.device, owner)
                if record is None or not any(c.footprint.unknown for c in mine):
                    if record is None:
                        self.ledger.release_unreadable(owner)
                    continue
                readable = {c.device for c in mine if not c.footprint.unknown}
                self.ledger.add_claims(self._claims_of(record, set(record.devices) - readable))
                self.ledger.release_unreadable(owner)
                log.warning("rewrote the unreadable claims of %s from its record", owner)

    def _claims_of(self, record: ContainerRecord, keys: set[str]) -> list[Claim]:
        out = []
        for key in sorted(keys):
            entry, device = record.devices[key], self.inventory.get(key)
            footprint = self.inventory.footprint(device) if device else claims.UNKNOWN
            holder = {k: v for k, v in entry.metadata.items() if k in _HOLDER_KEYS}
            group = entry.group or record.key
            out.append(Claim(record.key, key, group, footprint, entry.shared_with, holder))
        return out

    def _reconcile_one(self, record: ContainerRecord, report: ReconcileReport) -> None:
        container = self._live(record)
        if container is None:
            for key in record.devices:
                self.ledger.release(key, record.key)
            self.ledger.delete(record.key)
            report.forgotten.append(record.key)
            log.info("forgot %s: the container is gone", record.key)
            return
        if record.pending is not None:
            self._finish_pending(record, container)
            report.pending_finished += 1
        v1 = self._v1(record.v1_dir)
        if v1 is not None:
            for node_record in record.nodes.values():
                if node_record.v1_added and not v1.allows(_rule(node_record)):
                    v1.allow(_rule(node_record))
                    report.regranted += 1
        v2 = self._v2(record.v2_dir)
        if v2 is not None and record.nodes:
            rules = [_rule(n) for n in record.nodes.values()]
            before = v2.state()
            report.rewrapped += v2.grant(rules)
            if before.restricted:
                report.regranted += len(set(rules) - before.grants)
        with self._fs(container) as fs:
            for node_record in record.nodes.values():
                if fs.state(plan.node_of(node_record)) is NodeState.ABSENT:
                    fs.ensure(plan.node_of(node_record))
                    node_record.created = True
                    report.recreated += 1
        self.ledger.save(record)

    # -- helpers
    def _enter(self, ref: str | ContainerRef | Container) -> tuple[Container, _Liveness]:
        """The container, resolved and pinned by a pidfd (close the `_Liveness`).

        A container ID resolved before is taken from the resolver's cache, but only once
        proven under the pidfd: its init has the start time it had when resolved (so the
        PID is not another process's now), is still in the container's cgroup and is not
        in the host's mount namespace. Any doubt drops the entry and resolves afresh.
        """
        if isinstance(ref, Container):
            return ref, _Liveness(self._proc, ref).enter()
        if isinstance(ref, str):
            ref = parse_container_ref(ref)
        hit = self.resolver.cached(ref.container_id) if ref.container_id else None
        if hit is not None:
            cached, start_time = hit
            try:
                proven = _Liveness(self._proc, cached, start_time, self.resolver.host_mnt_ns())
                return cached, proven.enter()
            except (ContainerNotFound, NotInContainer):
                self.resolver.forget(cached.id or "")
        container = self.resolver.resolve(ref)
        alive = _Liveness(self._proc, container).enter()
        self.resolver.remember(container, alive.start_time)
        return container, alive

    def _record_for(self, container: Container, start_time: int) -> ContainerRecord:
        record = self.ledger.load(container.key)
        fresh = ContainerRecord(
            key=container.key,
            container_id=container.id,
            init_pid=container.init_pid,
            init_start_time=start_time,
            v1_dir=str(container.v1_devices_dir) if container.v1_devices_dir else None,
            v2_dir=str(container.v2_dir) if container.v2_dir else None,
        )
        if record is None:
            return fresh
        if (record.init_pid, record.init_start_time) != (container.init_pid, start_time):
            log.warning("dropping the stale record of %s: its init process changed", record.key)
            for key in record.devices:
                self.ledger.release(key, record.key)
            return fresh
        return record

    def _live(self, record: ContainerRecord) -> Container | None:
        ref = (
            ContainerRef(container_id=record.container_id)
            if record.container_id
            else ContainerRef(pid=record.init_pid)
        )
        try:
            container = self.resolve(ref)
        except (ContainerNotFound, NotInContainer):
            return None
        if container.init_pid != record.init_pid:
            return None
        if _start_time(self._proc, container.init_pid) != record.init_start_time:
            return None
        return container

    def _record_alive(self, key: str) -> bool:
        record = self.ledger.load(key)
        return record is not None and self._live(record) is not None

    def _v1(self, directory: str | None) -> V1Devices | None:
        if directory is None:
            return None
        try:
            return self._v1_dirs[directory]
        except KeyError:
            pass
        # The root cgroup restricts nothing. The drivers hold no state: kept per directory.
        v1 = None if os.path.normpath(directory) == self._v1_root else V1Devices(directory)
        if len(self._v1_dirs) > 4096:
            self._v1_dirs.clear()
        self._v1_dirs[directory] = v1
        return v1

    def _v2(self, directory: str | None) -> V2Devices | None:
        if directory is None:
            return None
        try:
            return self._v2_dirs[directory]
        except KeyError:
            pass
        v2 = None if os.path.normpath(directory) == self._v2_root else V2Devices(Path(directory))
        if len(self._v2_dirs) > 4096:
            self._v2_dirs.clear()
        self._v2_dirs[directory] = v2
        return v2

    def _v2_grant(self, directory: str | None, nodes: list[NodeRecord]) -> None:
        v2 = self._v2(directory)
        if v2 is not None:
            v2.grant([_rule(n) for n in nodes])

    @contextlib.contextmanager
    def _fs(self, container: Container) -> Iterator[ContainerFs]:
        proc_dir = f"{self._proc}/{container.init_pid}"
        fs = open_container_fs(proc_dir, self.config.node_method)
        try:
            yield fs
        finally:
            fs.close()


class _Liveness:
    """A pidfd on the container's init: notices an exit mid-operation, and PID reuse.

    `expected_start`: the init's start time when it was resolved (a cached resolution);
    another start time means the PID is another process's now. `host_mnt_ns`: refuse an
    init found in the host's mount namespace (re-checked for a cached resolution).
    """

    def __init__(
        self,
        proc: str,
        container: Container,
        expected_start: int | None = None,
        host_mnt_ns: str | None = None,
    ) -> None:
        self.container = container
        self.proc = proc
        self.expected_start = expected_start
        self.host_mnt_ns = host_mnt_ns

    def enter(self) -> _Liveness:
        pid = self.container.init_pid
        try:
            self.fd = os.pidfd_open(pid)
        except ProcessLookupError as exc:
            raise ContainerNotFound(f"container {self.container.key} has exited") from exc
        try:
            self.start_time = _start_time(self.proc, pid)
            if self.expected_start is not None and self.start_time != self.expected_start:
                raise ContainerNotFound(f"PID {pid} is no longer {self.container.key}'s init")
            self.check()
            if self.expected_start is not None:
                # A cached resolution: the same process (start time), and in the very
                # cgroups it was resolved in, so every directory derived from them holds.
                if _cgroups(self.proc, pid) != self.container.cgroups:
                    raise ContainerNotFound(f"PID {pid} has left {self.container.key}'s cgroups")
            elif not _member(self.container):
                # Resolved a moment ago, gone since, its PID now someone else's: the pidfd
                # holds whatever process has that PID, so prove it is still the container's.
                raise ContainerNotFound(f"container {self.container.key} has exited")
            if self.host_mnt_ns is not None and _mnt_ns(self.proc, pid) == self.host_mnt_ns:
                raise NotInContainer(f"process {pid} runs in the host's mount namespace")
        except BaseException:
            os.close(self.fd)
            raise
        return self

    def __enter__(self) -> _Liveness:
        return self if hasattr(self, "fd") else self.enter()

    def check(self) -> None:
        readable, _, _ = select.select([self.fd], [], [], 0)
        if readable:
            raise ContainerNotFound(f"container {self.container.key} exited mid-operation")

    def __exit__(self, *exc: object) -> None:
        os.close(self.fd)


def _normpath(path: Path | None) -> str | None:
    return os.path.normpath(path) if path is not None else None


def _member(container: Container) -> bool:
    """The init is in the container's cgroup: its own `cgroup.procs` first (one read),
    the whole subtree only when it is not there."""
    own = read_pids_file(f"{container.procs_dir}/cgroup.procs")
    return (own is not None and container.init_pid in own) or (
        container.init_pid in container.pids()
    )


def _read_proc(proc: str, pid: int, name: str, size: int) -> bytes:
    """One read of /proc/PID/`name` (os-level: the mount hot path); a gone process is
    ContainerNotFound, whether it went before the open or during the read."""
    try:
        fd = os.open(f"{proc}/{pid}/{name}", os.O_RDONLY | os.O_CLOEXEC)
    except (FileNotFoundError, ProcessLookupError) as exc:
        raise ContainerNotFound(f"process {pid} has exited") from exc
    try:
        return os.read(fd, size)
    except ProcessLookupError as exc:
        raise ContainerNotFound(f"process {pid} has exited") from exc
    finally:
        os.close(fd)


def _cgroups(proc: str, pid: int) -> CgroupPaths:
    return parse_proc_cgroup(_read_proc(proc, pid, "cgroup", 65536).decode())


def _mnt_ns(proc: str, pid: int) -> str:
    try:
        return os.readlink(f"{proc}/{pid}/ns/mnt")
    except (FileNotFoundError, ProcessLookupError) as exc:
        raise ContainerNotFound(f"process {pid} has exited") from exc


def _start_time(proc: str, pid: int) -> int:
    data = _read_proc(proc, pid, "stat", 4096)
    return int(data.rpartition(b")")[2].split()[19])  # field 22: starttime


def _rule(node_record: NodeRecord) -> DeviceRule:
    return plan.node_of(node_record).rule


def _mounted(device: Device) -> MountedDevice:
    return MountedDevice(
        device.key, str(device.kind), device.index, device.uuid, [n.path for n in device.nodes]
    )


def _label(device: Device) -> str:
    return f"{device.index} ({device.key})" if device.index is not None else device.key


_HOLDER_KEYS = ("namespace", "pod", "container")


def _claimed(device: Device | None, blockers: list[Claim]) -> DeviceClaimed:
    """409 naming every holder: the container, the name it mounted, its pod."""
    holders = []
    for b in blockers:
        where = f"container {b.owner}"
        if b.holder.get("pod"):
            where = (
                f"pod {b.holder.get('namespace')}/{b.holder['pod']} "
                f"(container {b.holder.get('container')}, {b.owner[:12]})"
            )
        named = "an unreadable claim (reconcile repairs it)" if b.footprint.unknown else b.device
        holders.append((where, named, b))
    label = _label(device) if device is not None else blockers[0].device
    held = "; ".join(f"{where} as {named}" for where, named, _ in holders)
    return DeviceClaimed(
        f"device {label} is the same physical device as one hot-mounted in {held}; "
        "unmount it there first, share it on purpose (shareWith), or force",
        blockers[0].owner,
        [{"containerId": b.owner, "device": b.device, **dict(b.holder)} for _, _, b in holders],
    )


def _quietly(fn: object, *args: object) -> None:
    try:
        fn(*args)  # type: ignore[operator]
    except Exception as exc:  # rollback must not hide the error that caused it
        log.warning("rollback step %s failed: %s", getattr(fn, "__name__", fn), exc)
