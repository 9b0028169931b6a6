"""Suspend: take a container's hot-mounted GPUs away, its CUDA processes kept alive and
their GPU memory moved into host memory. Resume: mount a GPU of the same model and
restore every suspended process onto it.

Suspend: find the processes (fds on the GPUs' nodes, NVML's lists), let the caller
refuse to take the GPUs from them (`held`: the agent's `force` check), check the memory
cgroup's room, then lock each (a bounded wait), checkpoint each, check that nothing
holds a node that leaves, and unmount. Resume: choose the GPUs, mount them, restore,
unlock. The ledger's `suspension` is written before each step: a crash part-way is
finished or rolled back by `reconcile`, and no process is left LOCKED (holding the GPU,
its CUDA calls blocked). The driver's API takes a PID, not a pidfd: a process is named
to it by host PID right after its pidfd (opened before the scan) shows it alive, and in
reconcile only with its recorded start time, in the container; what happens between
that look and the driver's own lookup of the PID is not ours to close. Results name
each process by its PID in the container's PID namespace, never the host's.

The container's operation lock is taken by each engine step (mount, unmount, a record
update); a second lock of its own (`<key>#suspend`) keeps suspensions and resumes of one
container apart, and reconcile out of one that runs.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from hotmount.engine import plan
from hotmount.engine.results import ReconcileReport
from hotmount.engine.surface import EngineSurface
from hotmount.errors import HotmountError, KernelError
from hotmount.host.containers import Container, ContainerRef
from hotmount.host.usage import Pinned
from hotmount.state.ledger import (
    ContainerRecord,
    CudaProcess,
    SuspendedGpu,
    Suspension,
    now,
)
from hotmount.suspend import choose, memory, nvml
from hotmount.suspend import processes as processes_
from hotmount.suspend.cuda import CheckpointApi, find_libcuda
from hotmount.suspend.model import ResumeResult, SuspendResult, gpu_uuid, listing
from hotmount.suspend.processes import Progress

log = logging.getLogger(__name__)

# The caller's say before a suspension takes the GPUs from the processes holding them
# (called only when there are any, before anything changes): raising refuses it.
Held = Callable[[list[CudaProcess]], None]
DEFAULT_LOCK_TIMEOUT = 10.0  # seconds a process may take to drain its GPU work and lock


def _quiet(event: str, details: dict[str, object]) -> None:
    return None


class Suspender:
    def __init__(self, engine: EngineSurface) -> None:
        self.engine = engine

    # -- the node's driver
    def api(self) -> CheckpointApi:
        root = self.engine.config.driver_root
        if root is None:
            raise choose.CheckpointUnsupported(
                "suspend needs the node's libcuda.so.1: the agent has no driver root set"
            )
        library = find_libcuda(self.engine.driver_host.path(root))
        if library is None:
            raise choose.CheckpointUnsupported(f"no libcuda.so.1 under the driver root {root}")
        return CheckpointApi(library)

    # -- suspend
    def suspend(
        self,
        ref: str | ContainerRef | Container,
        *,
        lock_timeout: float = DEFAULT_LOCK_TIMEOUT,
        progress: Progress = _quiet,
        held: Held | None = None,
    ) -> SuspendResult:
        """`held`: called with the processes found holding the GPUs, if any, before
        anything changes; what it raises refuses the suspension, nothing changed (the
        agent's `force` check: taking a GPU from its holders is what a forced unmount
        does). None: no one to ask (the idle policy `suspend`, the pod's own choice)."""
        engine = self.engine
        with engine.session(ref) as session, self._suspend_lock(session.key):
            container = session.container
            record = self._finish_first(container)
            if record is not None and record.suspended:
                raise choose.AlreadySuspended(
                    f"container {container.key}'s GPUs are suspended already"
                )
            keys = self._gpus(record)
            if record is None or not keys:
                raise choose.NotSuspended(f"container {container.key} has no hot-mounted GPU")
            api = self.api()
            version = api.version()
            choose.require_checkpoint(version)
            uuids = {k: gpu_uuid(d) for k in keys if (d := engine.inventory.get(k))}
            view = nvml.look([u for u in uuids.values() if u])
            if view is None:
                raise choose.CheckpointUnsupported(
                    "NVML does not load: the GPU memory to move cannot be known; "
                    "nothing was changed"
                )
            leaving = plan.nodes_to_remove(record, keys)
            numbers = {(n.major, n.minor) for n in leaving}
            own = engine.sessions.pid_namespace(container.init_pid)
            with Pinned.pin(container.pids) as pinned:
                found = {h.pid for h in pinned.holders(engine.host.proc, numbers)}
                found |= set(view.processes) & set(pinned.pids)
                processes = [
                    CudaProcess(
                        pid=pid,
                        start_time=engine.sessions.start_time(pid),
                        gpu_bytes=view.processes.get(pid, 0),
                        container_pid=engine.sessions.pid_in(pid, own),
                    )
                    for pid in sorted(found)
                ]
                if processes and held is not None:
                    held(processes)
                need = sum(p.gpu_bytes for p in processes)
                room = memory.room(engine.host, container.init_pid)
                choose.require_room(need, room, container.key)
                progress("found", {"processes": len(processes), "gpuBytes": need})
                step = Suspension(op="suspend", step="locking", devices=keys, processes=processes)
                self._save(container.key, suspension=step)
                progress("step", {"step": "locking"})
                self._lock_all(api, pinned, processes, lock_timeout, progress, container.key)
                step = step.model_copy(update={"step": "checkpointing"})
                self._save(container.key, suspension=step)
                progress("step", {"step": "checkpointing"})
                self._checkpoint_all(api, pinned, processes, progress, container.key)
            try:
                record = self._load(container.key)
                engine.use.clear(engine.inventory, container, record, keys, leaving, False, True)
            except HotmountError:
                self._roll_back(api, container, processes)
                raise
            suspended = {
                k: SuspendedGpu(
                    device=record.devices[k],
                    uuid=uuids.get(k) or "",
                    model=view.models.get(uuids.get(k) or ""),
                    suspended_at=now(),
                )
                for k in keys
            }
            self._save(
                container.key,
                suspension=step.model_copy(update={"step": "unmounting"}),
                suspended=suspended,
                suspended_processes=processes,
            )
            progress("step", {"step": "unmounting"})
            self._unmount(container, keys, api, processes)
            progress("unmounted", {"devices": keys})
            self._save(container.key, suspension=None)
            log.info("suspended %s of %s (%d processes)", keys, container.key, len(processes))
            return SuspendResult(container.as_dict(), keys, listing(processes))

    def _lock_all(
        self,
        api: CheckpointApi,
        pinned: Pinned,
        processes: list[CudaProcess],
        timeout: float,
        progress: Progress,
        key: str,
    ) -> None:
        try:
            processes_.lock_all(api, pinned, processes, timeout, progress)
        except choose.ProcessWontLock:
            self._save(key, suspension=None)
            raise

    def _checkpoint_all(
        self,
        api: CheckpointApi,
        pinned: Pinned,
        processes: list[CudaProcess],
        progress: Progress,
        key: str,
    ) -> None:
        try:
            processes_.checkpoint_all(api, pinned, processes, progress)
        except KernelError:
            self._save(key, suspension=None)
            raise

    def _unmount(
        self,
        container: Container,
        keys: list[str],
        api: CheckpointApi,
        processes: list[CudaProcess],
    ) -> None:
        record = self._load(container.key)
        if record.pending is None and all(k in record.devices for k in keys):
            try:
                self.engine.unmount(container, keys)
            except HotmountError:
                record = self._load(container.key)
                if record.pending is None and all(k in record.devices for k in keys):
                    self._roll_back(api, container, processes)
                raise
        elif any(k in record.devices for k in keys):
            self.engine.unmount(container, [k for k in keys if k in record.devices])

    def _roll_back(
        self, api: CheckpointApi, container: Container, processes: list[CudaProcess]
    ) -> None:
        """Back to running on the GPUs still mounted: restore whoever is checkpointed,
        unlock whoever is locked; the suspension forgotten."""
        for process in self._still_there(container, processes):
            state = processes_.attempt(api.state, process.pid)
            if state == "checkpointed":
                processes_.attempt(api.restore, process.pid, [])
                state = processes_.attempt(api.state, process.pid)
            if state == "locked":
                processes_.attempt(api.unlock, process.pid)
        self._save(container.key, suspension=None, suspended={}, suspended_processes=[])

    # -- resume
    def plan(
        self,
        ref: str | ContainerRef | Container,
        *,
        onto: list[str] | None = None,
        unavailable: frozenset[str] = frozenset(),
    ) -> dict[str, str]:
        """Old key -> the key of the GPU a resume would mount now (`onto`, `unavailable`
        as for `resume`), with every refusal `resume` would give, and nothing changed: the
        agent pins those GPUs first (agent/suspend/suspending.py), then resumes onto them."""
        with self.engine.session(ref) as session, self._suspend_lock(session.key):
            container = session.container
            record = self._finish_first(container)
            _, chosen, _ = self._decide(container, record, onto, unavailable)
            return {old: c.key for old, c in chosen.items()}

    def resume(
        self,
        ref: str | ContainerRef | Container,
        *,
        onto: list[str] | None = None,
        unavailable: frozenset[str] = frozenset(),
        pins: dict[str, dict[str, str]] | None = None,
        progress: Progress = _quiet,
    ) -> ResumeResult:
        """`onto`: GPUs (keys, UUIDs) to resume onto, one per suspended GPU; `unavailable`:
        keys the caller knows are taken (the kubelet gave them to another pod); `pins`:
        metadata recorded with each GPU mounted, by its key (its pin pod, made by the
        caller: agent/books/pins.py), so the mount names it as a mount by name does."""
        with self.engine.session(ref) as session, self._suspend_lock(session.key):
            container = session.container
            record = self._finish_first(container)
            api, chosen, moves = self._decide(container, record, onto, unavailable)
            assert record is not None
            processes = record.suspended_processes
            found: dict[str, object] = {
                "processes": len(processes),
                "gpuBytes": sum(p.gpu_bytes for p in processes),
            }
            progress("found", found)
            step = Suspension(
                op="resume",
                step="mounting",
                devices=list(record.suspended),
                processes=processes,
                targets={o: c.key for o, c in chosen.items()},
            )
            self._save(container.key, suspension=step)
            progress("step", {"step": "mounting"})
            try:
                self._mount(container, record, step.targets, pins or {})
            except HotmountError:
                self._save(container.key, suspension=None)
                raise
            progress("mounted", {"devices": list(step.targets.values())})
            self._save(container.key, suspension=step.model_copy(update={"step": "restoring"}))
            progress("step", {"step": "restoring"})
            self._restore_all(api, container, processes, list(moves.items()), progress)
            self._save(container.key, suspension=None, suspended={}, suspended_processes=[])
            log.info("resumed %s of %s onto %s", list(chosen), container.key, step.targets)
            return ResumeResult(container.as_dict(), dict(step.targets), listing(processes))

    def _decide(
        self,
        container: Container,
        record: ContainerRecord | None,
        onto: list[str] | None,
        unavailable: frozenset[str],
    ) -> tuple[CheckpointApi, dict[str, choose.Candidate], dict[str, str]]:
        """The driver, the GPU each suspended one resumes onto, and the moves (old UUID ->
        new UUID) among them; or the refusal."""
        if record is None or not record.suspended:
            raise choose.NotSuspended(f"container {container.key} has no suspended GPU")
        api = self.api()
        version = api.version()
        choose.require_checkpoint(version)
        chosen = self._choose(record, onto, unavailable)
        moves = {record.suspended[o].uuid: c.uuid for o, c in chosen.items() if c.key != o}
        choose.require_moves(version, moves)
        return api, chosen, moves

    def free_gpus(self, unavailable: frozenset[str] = frozenset()) -> list[choose.Candidate]:
        """The whole GPUs no claim holds (and not `unavailable`), each with NVML's model
        name (one GPU may be listed under two names): what a resume may land on, and
        what an on-demand pod's first GPU is taken from (agent/ondemand/)."""
        engine = self.engine
        gpus = [d for d in engine.inventory.devices if gpu_uuid(d)]
        view = nvml.look([gpu_uuid(d) or "" for d in gpus])
        models = view.models if view else {}
        held = engine.holders()
        # One GPU may be listed twice (NVML's and a CDI spec's name): held under one name
        # is held under both.
        taken = {gpu_uuid(d) for d in gpus if d.key in held or d.key in unavailable}
        return [
            choose.Candidate(d.key, gpu_uuid(d) or "", models.get(gpu_uuid(d) or ""))
            for d in gpus
            if gpu_uuid(d) not in taken and d.mig is None
        ]

    def _choose(
        self, record: ContainerRecord, onto: list[str] | None, unavailable: frozenset[str]
    ) -> dict[str, choose.Candidate]:
        old = [choose.Candidate(k, s.uuid, s.model) for k, s in record.suspended.items()]
        return choose.targets(old, self.free_gpus(unavailable), onto)

    def _mount(
        self,
        container: Container,
        record: ContainerRecord,
        targets: dict[str, str],
        pins: dict[str, dict[str, str]],
    ) -> None:
        fresh = self._load(container.key)
        if all(new in fresh.devices for new in targets.values()):
            return  # mounted before a crash
        first = record.suspended[next(iter(targets))].device

        released = self.engine.config.released_on_suspend  # e.g. the agent's old pin: gone

        def kept(metadata: dict[str, str]) -> dict[str, str]:
            return {k: v for k, v in metadata.items() if k not in released}

        self.engine.mount(
            container,
            list(targets.values()),
            metadata=kept(first.metadata),
            group=first.group,
            share_with=first.shared_with,
            workload=first.workload,
            device_metadata={
                n: {**kept(record.suspended[o].device.metadata), **pins.get(n, {})}
                for o, n in targets.items()
            },
        )

    def _restore_all(
        self,
        api: CheckpointApi,
        container: Container,
        processes: list[CudaProcess],
        pairs: list[tuple[str, str]],
        progress: Progress,
    ) -> None:
        processes_.restore_all(
            api,
            self._still_there(container, processes),
            pairs,
            progress,
            undo=lambda restored: self._back_to_suspended(api, container, restored),
        )

    def _back_to_suspended(
        self, api: CheckpointApi, container: Container, restored: list[CudaProcess]
    ) -> None:
        """A restore failed: whoever was restored is checkpointed again (it is still
        locked), and the GPUs the resume mounted leave; the suspension stays as it was."""
        for process in restored:
            processes_.attempt(api.checkpoint, process.pid)
        record = self._load(container.key)
        step = record.suspension
        mounted = [new for new in (step.targets.values() if step else []) if new in record.devices]
        if mounted:
            self.engine.unmount(container, mounted)
        self._save(container.key, suspension=None)

    # -- reconcile
    def reconcile(self, report: ReconcileReport | None = None) -> int:
        """Finish or roll back every suspension a crash left part-way; returns how many."""
        return sum(self.repair(record, report) for record in self.unfinished())

    def unfinished(self) -> list[ContainerRecord]:
        """The records with a suspension part-way: left by a crash, or running now."""
        return [r for r in self.engine.ledger.records() if r.suspension is not None]

    def repair(self, record: ContainerRecord, report: ReconcileReport | None = None) -> bool:
        """Finish or roll back `record`'s suspension if a crash left it part-way: whether
        it did. A suspend or resume that runs now (its lock is held) finishes its own
        steps, and a container that is gone is the engine's reconcile's to forget. Its
        restores may take minutes (a deadline of ten per process): the agent runs this
        beside its reconcile pass, not in it (agent/common/background.py)."""
        container = self.engine.sessions.live(record)
        if container is None:
            return False
        try:
            with self.engine.ledger.try_lock(f"{record.key}#suspend") as mine:
                if not mine:
                    return False
                self._finish_first(container)
            return True
        except HotmountError as exc:
            log.warning("reconcile of %s's suspension: %s", record.key, exc.message)
            if report is not None:
                report.errors[record.key] = exc.message
            return False

    def _finish_first(self, container: Container) -> ContainerRecord | None:
        """A suspension a crash left part-way: locking or checkpointing rolls back; an
        unmount goes on; a resume's mount rolls back, its restores go on."""
        record = self.engine.ledger.load(container.key)
        if record is None or record.suspension is None:
            return record
        step = record.suspension
        api = self.api()
        log.info("finishing %s's %s, left at %s", container.key, step.op, step.step)
        if step.op == "suspend" and step.step in ("locking", "checkpointing"):
            self._roll_back(api, container, step.processes)
        elif step.op == "suspend":
            self._unmount(container, step.devices, api, step.processes)
            self._save(container.key, suspension=None)
        elif step.step == "mounting":
            record = self._load(container.key)
            self._back_to_suspended(api, container, [])
        else:
            pairs = [
                (record.suspended[o].uuid, self._uuid_of(n))
                for o, n in step.targets.items()
                if o != n
            ]
            self._restore_all(api, container, step.processes, pairs, _quiet)
            self._save(container.key, suspension=None, suspended={}, suspended_processes=[])
        return self.engine.ledger.load(container.key)

    # -- helpers
    def _uuid_of(self, key: str) -> str:
        device = self.engine.inventory.get(key)
        return (gpu_uuid(device) if device else None) or ""

    def _gpus(self, record: ContainerRecord | None) -> list[str]:
        if record is None:
            return []
        found = []
        for key, entry in record.devices.items():
            device = self.engine.inventory.get(key)
            if device is not None and gpu_uuid(device) and not entry.with_devices:
                found.append(key)
        return found

    def _still_there(self, container: Container, processes: list[CudaProcess]) -> list[CudaProcess]:
        """The processes that still run in the container: the same start time, and still
        in its cgroup (a PID reused by another process anywhere is not touched)."""
        members = set(container.pids())
        out = []
        for process in processes:
            try:
                same = self.engine.sessions.start_time(process.pid) == process.start_time
            except HotmountError:
                continue
            if same and process.pid in members:
                out.append(process)
        return out

    @contextmanager
    def _suspend_lock(self, key: str) -> Iterator[None]:
        with self.engine.ledger.lock(f"{key}#suspend"):
            yield

    def _load(self, key: str) -> ContainerRecord:
        record = self.engine.ledger.load(key)
        if record is None:
            raise KernelError(f"the ledger record of {key} is gone mid-operation")
        return record

    def _save(self, key: str, **changes: object) -> None:
        with self.engine.ledger.lock(key):
            record = self._load(key)
            for name, value in changes.items():
                setattr(record, name, value)
            self.engine.ledger.save(record)
