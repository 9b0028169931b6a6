"""Idle reclaim: the idle clock of every hot-mounted GPU, the warning, and taking back
the GPUs idle for their timeout. The pure rules (policies, timeouts, when to warn and
reclaim) are agent/idle/policy.py's; here are the looks (the containers' processes, NVML's
utilization, once per pass for all GPUs), the Events and the unmounts."""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from agent.books.holders import HolderPods
from agent.common.background import Background
from agent.common.locks import ContainerLocks
from agent.common.results import device_label, unclassified_text
from agent.config import AgentSettings
from agent.errors import BadRequest
from agent.idle import policy as idle
from agent.idle.clocks import IdleState, Look, clock_key
from agent.idle.suspend import suspend_idle
from agent.kube.client import KubeClient
from agent.metrics import Metrics
from hotmount.api import (
    RDMA_NODE_DIR,
    ActivitySampler,
    ContainerRecord,
    DeviceBusy,
    DeviceRecord,
    Engine,
    GpuActivity,
    HeldWithStayingDevices,
    HotmountError,
    ScanIncomplete,
    gpu_uuid,
    is_rdma,
    nvml_pids,
    scan_holders,
)
from hotmount.wire.durations import format_duration
from hotmount.wire.schemas import MountRequest

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class IdleReclaim:
    settings: AgentSettings
    engine: Engine
    kube: KubeClient | None
    metrics: Metrics
    locks: ContainerLocks
    holders: HolderPods
    background: Background = field(default_factory=Background)  # idle suspensions
    # When each mount was first seen idle, and warned; kept beside the ledger.
    _idle: idle.IdleClock = field(default_factory=idle.IdleClock, init=False, repr=False)
    _sampler: ActivitySampler = field(default_factory=ActivitySampler, init=False, repr=False)
    # Per clock key, from the last pass: the container's GPU utilization (0..1), and why
    # `unused` fell back to `unheld`.
    _utilization: dict[tuple[str, str, str], float] = field(
        default_factory=dict, init=False, repr=False
    )
    _notes: dict[tuple[str, str, str], str] = field(default_factory=dict, init=False, repr=False)
    _loaded: list[IdleState] = field(default_factory=list, init=False, repr=False)

    def idle_meta(self, request: MountRequest, annotations: dict[str, str]) -> dict[str, str]:
        """Ledger metadata for idle reclaim: a fresh mount ID (its idle clock's key: a GPU
        unmounted and mounted again within a second must not inherit the old clock), the
        idle timeout in seconds, if any (the request's, else the pod's annotation, else
        the node's default), and the idle policy (chosen the same way)."""
        try:
            timeout = idle.choose_timeout(
                request.idle_timeout, annotations, self.settings.idle_timeout
            )
            policy = idle.choose_policy(request.idle_policy, annotations, self.settings.idle_policy)
            before = idle.choose_warn_before(request.warn_before, annotations, timeout)
        except ValueError as exc:
            raise BadRequest(str(exc)) from exc
        meta = {idle.MOUNT_ID_KEY: secrets.token_hex(6), idle.POLICY_KEY: policy}
        if timeout is not None:
            meta[idle.TIMEOUT_KEY] = f"{timeout:g}"
        if before is not None:
            meta[idle.WARN_KEY] = f"{before:g}"
        return meta

    def idle_for(self, owner: str, entry: DeviceRecord, now: float) -> float | None:
        """How long the mount has been seen idle (0: in use; None: not looked at yet)."""
        self._state()
        return self._idle.idle_for(clock_key(owner, entry), now)

    def reclaim_in(self, owner: str, entry: DeviceRecord, now: float) -> float | None:
        """Seconds until the reclaim, once warned (None: not warned)."""
        key = clock_key(owner, entry)
        since, warned = self._idle.since(key), self._idle.warned_at(key)
        timeout = idle.timeout_of(entry.metadata)
        if since is None or warned is None or timeout is None:
            return None
        before = idle.warn_before_of(entry.metadata)
        return max(0.0, idle.reclaim_at(timeout, since, warned, before) - now)

    def utilization(self, owner: str, entry: DeviceRecord) -> float | None:
        return self._utilization.get(clock_key(owner, entry))

    def policy_note(self, owner: str, entry: DeviceRecord) -> str | None:
        return self._notes.get(clock_key(owner, entry))

    def reclaim_idle(self) -> list[str]:
        """Look at every hot-mounted GPU; warn those about to be reclaimed, and unmount
        those idle for their timeout.

        The look, by the mount's policy: `unheld`, an fd scan of the container's
        processes for the GPU's own nodes (not the control nodes every GPU shares), then
        NVML's process list where NVML loads; `unused`, NVML's utilization (one sample of
        every such GPU per pass, agent/idle/policy.py), or the `unheld` look where NVML cannot
        sample the GPU. The clock starts at the first look that finds it idle. The
        unmount runs under the container's lock: under `unheld` the engine checks for
        holders again (a process that opened the GPU since keeps it); under `unused` the
        GPU is sampled again and its holders are stopped (SIGTERM, then SIGKILL), but
        never a process that also uses a GPU that stays: that reclaim is skipped and the
        pod told why (GPUReclaimSkipped). The shared control nodes count only when the
        container's last GPU leaves (hotmount/engine/inuse.py `UseCheck.clear`). Under
        `suspend`, idle is judged as under `unused` and the container's GPUs are
        suspended instead (agent/idle/suspend.py): no process is stopped, and the
        suspension runs beside the pass, which does not wait for it. A container whose
        lock another call holds (a suspension that runs) is skipped until a later pass.
        Returns the devices unmounted in this pass (not those being suspended).

        A look at the open files that cannot finish (a tenant's fd flood, a filesystem
        that does not answer, hotmount/tenantfs/openfiles.py) cannot prove the GPU idle: under
        `unheld` it counts as held, as a process holding the GPU open does (the flood
        gets the tenant nothing an open fd would not). It never blocks a reclaim that
        is due under `unused`: that unmount is forced, and a forced unmount revokes the
        GPU anyway and stops the processes the look could not clear (but, while other
        GPUs stay in the container, not a process that may use them: the reclaim is
        skipped, GPUReclaimSkipped, as for a process that holds both). Nor does it block
        a take-back: a mount whose pin or holder is gone goes whatever any look finds
        (agent/books/holders.py).
        """
        state = self._state()
        mounts = []
        for record in self.engine.mounts.records():
            entries = [d for d in record.devices.values() if self.is_gpu(d)]
            if not entries:
                continue
            try:
                pids = self.engine.resolve(record.container_id or record.key).pids()
            except HotmountError:
                continue  # gone: the engine's reconcile forgets it
            mounts += [(record, entry, pids) for entry in entries]
        activity = self._sample(entry for _, entry, _ in mounts)
        looks, warn, due = [], [], []
        for record, entry, pids in mounts:
            key = clock_key(record.key, entry)
            busy = self._in_use(record, entry, pids, activity, key)
            now = time.time()  # after the look: conservative (agent/idle/policy.py)
            since = self._idle.observe(key, busy, now)
            look = Look(record, entry, key, since, now)
            looks.append(key)
            timeout = idle.timeout_of(entry.metadata)
            before = idle.warn_before_of(entry.metadata)
            warned = self._idle.warned_at(key)
            if idle.should_warn(timeout, since, warned, now, before):
                self._idle.warn(key, now)
                warn.append(look)
            elif idle.should_reclaim(timeout, since, warned, now, before):
                due.append(look)
        self._idle.retain(looks)
        for gone in set(self._utilization) - set(looks):
            self._utilization.pop(gone, None)
        for gone in set(self._notes) - set(looks):
            self._notes.pop(gone, None)
        state.save(self._idle)
        for look in warn:
            self._warn(look)
        taken = []
        suspending: dict[str, list[Look]] = {}
        for look in due:
            if idle.policy_of(look.entry.metadata) == idle.SUSPEND:
                suspending.setdefault(look.record.key, []).append(look)
            elif self._reclaim(look):
                taken.append(look.entry.key)
        for group in suspending.values():
            suspend_idle(self, group)  # started beside the pass: not counted in `taken`
        state.save(self._idle)
        return taken

    def close(self) -> None:
        self._sampler.close()

    def _state(self) -> IdleState:
        """The kept clocks, loaded at the first use after a start."""
        if not self._loaded:
            state = IdleState(self.settings.state_dir)
            state.load(self._idle, time.time())
            self._loaded.append(state)
        return self._loaded[0]

    def _sample(self, entries: Iterable[DeviceRecord]) -> dict[str, GpuActivity]:
        """One NVML sample of every GPU under the `unused` (or `suspend`) policy."""
        uuids = []
        for entry in entries:
            device = self.engine.inventory.get(entry.key)
            uuid = gpu_uuid(device) if device else None
            if idle.judged_by_use(idle.policy_of(entry.metadata)) and uuid:
                uuids.append(uuid)
        self._sampler.retain(uuids)  # GPUs no longer under `unused` lose their cursor
        if not uuids or not self.engine.config.use_nvml:
            return {}
        return self._sampler.sample(uuids)

    def _in_use(
        self,
        record: ContainerRecord,
        entry: DeviceRecord,
        pids: list[int],
        activity: dict[str, GpuActivity],
        key: tuple[str, str, str],
    ) -> int:
        """1 or more when the mount counts as used under its policy, else 0."""
        if idle.judged_by_use(idle.policy_of(entry.metadata)):
            device = self.engine.inventory.get(entry.key)
            uuid = gpu_uuid(device) if device else None
            seen = activity.get(uuid) if uuid else None
            if seen is not None and seen.judged:
                self._notes.pop(key, None)
                self._utilization[key] = seen.utilization_for(pids)
                return int(seen.busy_for(pids))
            why = (
                seen.why_not
                if seen is not None
                else ("NVML is off (--no-use-nvml)" if device else "not an NVML GPU")
            )
            note = f"judged by holders (unheld): {why}"
            if self._notes.get(key) != note:
                log.info("idle by use of %s in %s: %s", entry.key, record.key, note)
            self._notes[key] = note
        return self._held(record, entry, pids)

    def is_gpu(self, entry: DeviceRecord) -> bool:
        """A GPU (or MIG, or another accelerator), not an RDMA device: one sysfs found
        (kind `rdma`) or one a CDI spec declares (kind `cdi`, verbs nodes), nor any
        device that came along with GPUs (it leaves with them, never idle on its own)."""
        if entry.with_devices or entry.kind == "rdma":
            return False
        device = self.engine.inventory.get(entry.key)
        if device is not None:
            return not is_rdma(device)
        return not any(p.startswith(RDMA_NODE_DIR) for p in entry.node_paths)

    def _held(self, record: ContainerRecord, entry: DeviceRecord, pids: list[int]) -> int:
        """How many of the container's processes hold the device (fd scan, then NVML)."""
        device = self.engine.inventory.get(entry.key)
        if device is not None:
            numbers = {(n.major, n.minor) for n in device.nodes}
        else:
            numbers = {
                (record.nodes[p].major, record.nodes[p].minor)
                for p in entry.node_paths
                if p in record.nodes
            }
        try:
            seen = scan_holders(self.engine.host.proc, pids, numbers)
        except HotmountError as exc:
            log.warning("idle check of %s in %s: %s", entry.key, record.key, exc.message)
            return 1
        found = len(seen.found)
        if not found and not seen.complete:  # cannot prove it idle: held
            log.warning(
                "idle check of %s in %s: counted as held: %s",
                entry.key,
                record.key,
                seen.error(record.key).message,
            )
            return 1
        if not found and device is not None and device.uuid and self.engine.config.use_nvml:
            found = len(nvml_pids([device.uuid]) & set(pids))
        return found

    def _warn(self, look: Look) -> None:
        """GPUIdleSoon on the pod, and the warning counted."""
        entry = look.entry
        timeout = idle.timeout_of(entry.metadata) or 0
        since = look.since if look.since is not None else look.now
        before = idle.warn_before_of(entry.metadata)
        left = idle.reclaim_at(timeout, since, look.now, before) - look.now
        policy = idle.policy_of(entry.metadata)
        judged = idle.judged_by_use(policy) and look.key not in self._notes
        what = "unused" if judged else "unheld"
        taken = "suspended" if policy == idle.SUSPEND else "reclaimed"
        container = entry.metadata.get("container") or look.record.key
        message = (
            f"{self.device_text(entry.key)} in {container} "
            f"has been {what} for {format_duration(look.now - since)}: {taken} in "
            f"{format_duration(left)} unless used (idle timeout "
            f"{format_duration(timeout)}, policy {policy})"
        )
        self.metrics.idle_warnings.inc()
        log.info("%s", message)
        self.pod_event(entry, "GPUIdleSoon", message, warning=True)

    def _reclaim(self, look: Look) -> bool:
        """Unmount one idle device under the container's lock (under `unused`, stopping
        its holders), release its holder pod, and tell the pod (Event) and the metrics.
        A container whose lock another holds is left for the next pass, never waited for."""
        record, entry = look.record, look.entry
        ref = record.container_id or record.key
        meta = entry.metadata
        namespace = meta.get("namespace")
        key = look.key
        unused = idle.policy_of(meta) == idle.UNUSED and key not in self._notes
        idle_for = look.now - (look.since or look.now)
        stopped: list[int] = []
        more = ""
        try:
            with self.locks.try_hold(ref) as free:
                if not free:  # a suspension (or another call) runs: due again next pass
                    log.debug("reclaim of %s from %s: the container is busy", entry.key, ref)
                    return False
                now = self.engine.mounts.record(record.key)
                current = now.devices.get(entry.key) if now else None
                if current is None or current.mounted_at != entry.mounted_at:
                    return False  # unmounted (or mounted anew) meanwhile
                if unused and self.used_again(record, entry):
                    self._idle.observe(key, 1, time.time())
                    log.info(
                        "reclaim of %s from %s: used again, its clock restarts", entry.key, ref
                    )
                    return False
                before = self.holders.named_in(ref)
                result = self.engine.unmount(ref, [entry.key], force=unused)
                unclassified = set(result.unclassified_pids)
                stopped = [p for p in result.stopped_pids if p not in unclassified]
                more = unclassified_text(result)
        except HeldWithStayingDevices as exc:
            self._skipped(look, exc)
            return False
        except (DeviceBusy, ScanIncomplete) as exc:
            # Opened meanwhile, or (unheld) it cannot be proved idle: held again.
            self._idle.observe(key, 1, time.time())
            log.info(
                "reclaim of %s from %s: in use, its idle clock restarts: %s",
                entry.key,
                ref,
                exc.message,
            )
            return False
        except (HotmountError, OSError) as exc:
            # An OSError too (a read-only /dev in the container): one reclaim that fails
            # must not fail the whole pass, and it is counted for the alert.
            why = exc.message if isinstance(exc, HotmountError) else str(exc)
            log.warning("cannot reclaim %s from %s: %s", entry.key, ref, why)
            self.metrics.reclaim_failures.labels("error").inc()
            return False
        # Not waiting for the pods to go: a pod the tenant keeps terminating (a finalizer)
        # must not keep the pass from finishing.
        released = self.holders.release_after(namespace, before, "reclaim", wait=False)
        self._idle.forget(key)
        self.metrics.reclaimed.inc()
        timeout = idle.timeout_of(meta) or 0
        why = (
            f"{'unused' if unused else 'idle'} for {format_duration(idle_for)} "
            f"(idle timeout {format_duration(timeout)})"
        )
        if stopped:
            why += (
                f"; stopped PIDs {', '.join(map(str, stopped))} that held it (SIGTERM, then "
                f"SIGKILL after {self.settings.stop_grace:g}s)"
            )
        why += more
        label = self.device_text(entry.key)
        log.info("reclaimed %s from %s: %s; holder pods deleted: %s", label, ref, why, released)
        container = meta.get("container") or ref
        self.pod_event(entry, "GPUReclaimed", f"took {label} back from {container}: {why}")
        return True

    def _skipped(self, look: Look, exc: HeldWithStayingDevices) -> None:
        """A process uses this GPU and one that stays: it is not stopped, the GPU stays,
        the pod is told why (Event), and the clock starts again (a warning comes first)."""
        self._idle.observe(look.key, 1, time.time())
        self.metrics.reclaim_failures.labels("skipped").inc()
        label = self.device_text(look.entry.key)
        container = look.entry.metadata.get("container") or look.record.key
        message = (
            f"did not take {label} back from {container}: {exc.message}. Stopping them "
            "would stop their work on the GPUs that stay; the idle clock starts again"
        )
        log.info("%s", message)
        self.pod_event(look.entry, "GPUReclaimSkipped", message, warning=True)

    def noted(self, key: tuple[str, str, str]) -> bool:
        """Whether the last pass judged this mount `unheld` where `unused` was asked
        (NVML could not judge it): then no last look at its use is taken."""
        return key in self._notes

    def restart_clock(self, key: tuple[str, str, str], when: float) -> None:
        """Count the mount as used at `when`: its idle clock and warning start again."""
        self._idle.observe(key, 1, when)

    def forget_clock(self, key: tuple[str, str, str]) -> None:
        """The mount is gone (taken back, suspended): its clock goes too."""
        self._idle.forget(key)

    def used_again(self, record: ContainerRecord, entry: DeviceRecord) -> bool:
        """Under `unused`, a last look just before the holders are stopped."""
        device = self.engine.inventory.get(entry.key)
        uuid = gpu_uuid(device) if device else None
        if uuid is None:
            return False
        try:
            pids = self.engine.resolve(record.container_id or record.key).pids()
        except HotmountError:
            return False
        seen = self._sampler.sample([uuid]).get(uuid)
        return seen is not None and seen.judged and seen.busy_for(pids)

    def pod_event(
        self, entry: DeviceRecord, reason: str, message: str, warning: bool = False
    ) -> None:
        namespace, pod_name = entry.metadata.get("namespace"), entry.metadata.get("pod")
        if namespace and pod_name and self.kube is not None:
            self.kube.event_on_pod(namespace, pod_name, reason, message, warning=warning)

    def device_text(self, key: str) -> str:
        device = self.engine.inventory.get(key)
        return f"GPU {device_label(device)}" if device is not None else key
