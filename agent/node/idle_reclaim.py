"""Idle reclaim: the idle clock of every hot-mounted GPU, and taking back the GPUs
unheld for their idle timeout. The pure rules (timeouts, when to reclaim) are
agent/idle.py's; here are the looks at the containers' processes and the unmounts."""

from __future__ import annotations

import logging
import secrets
import time
from dataclasses import dataclass, field

from agent import idle
from agent.config import AgentSettings
from agent.errors import ApiError, BadRequest
from agent.kube.client import KubeClient
from agent.metrics import Metrics
from agent.node.holders import HolderPods
from agent.node.locks import ContainerLocks
from agent.node.results import clock_key, device_label, record_event
from agent.schemas import MountRequest
from hotmount import engine as eng
from hotmount import usage
from hotmount.devices.rdma import RDMA_NODE_DIR, is_rdma
from hotmount.errors import DeviceBusy, HotmountError
from hotmount.ledger import ContainerRecord, DeviceRecord

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class IdleReclaim:
    settings: AgentSettings
    engine: eng.Engine
    kube: KubeClient | None
    metrics: Metrics
    locks: ContainerLocks
    holders: HolderPods
    # When each mount was first seen unheld.
    _idle: idle.IdleClock = field(default_factory=idle.IdleClock, init=False, repr=False)

    def idle_meta(self, request: MountRequest, annotations: dict[str, str]) -> dict[str, str]:
        """Ledger metadata for idle reclaim: a fresh mount ID (its idle clock's key: a GPU
        unmounted and mounted again within a second must not inherit the old clock), and
        the idle timeout in seconds, if any: the request's, else the pod's annotation,
        else the node's default."""
        try:
            timeout = idle.choose_timeout(
                request.idle_timeout, annotations, self.settings.idle_timeout
            )
        except ValueError as exc:
            raise BadRequest(str(exc)) from exc
        meta = {idle.MOUNT_ID_KEY: secrets.token_hex(6)}
        if timeout is not None:
            meta[idle.TIMEOUT_KEY] = f"{timeout:g}"
        return meta

    def idle_for(self, owner: str, entry: DeviceRecord, now: float) -> float | None:
        """How long the mount has been seen unheld (None: held, or not looked at yet)."""
        return self._idle.idle_for(clock_key(owner, entry), now)

    def reclaim_idle(self) -> list[str]:
        """Look at every hot-mounted GPU; unmount those unheld for their idle timeout.

        The look: an fd scan of the container's processes for the GPU's own nodes (not
        the control nodes every GPU shares), then NVML's process list where NVML loads.
        The clock (agent/idle.py) starts at the first look that finds it unheld. The
        unmount runs under the container's lock and the engine checks for holders again
        (pidfds, then the scan): a process that opened the GPU since keeps it.
        """
        looked, due = [], []
        for record in self.engine.ledger.records():
            entries = [d for d in record.devices.values() if self.is_gpu(d)]
            if not entries:
                continue
            try:
                pids = self.engine.resolve(record.container_id or record.key).pids()
            except HotmountError:
                continue  # gone: the engine's reconcile forgets it
            for entry in entries:
                key = clock_key(record.key, entry)
                held = self._held(record, entry, pids)
                now = time.monotonic()  # after the scan: conservative (agent/idle.py)
                since = self._idle.observe(key, held, now)
                looked.append(key)
                timeout = idle.timeout_of(entry.metadata)
                if since is not None and idle.should_reclaim(timeout, since, now, held):
                    due.append((record, entry, now - since))
        self._idle.retain(looked)
        taken = []
        for record, entry, idle_for in due:
            if self._reclaim(record, entry, idle_for):
                taken.append(entry.key)
        return taken

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
        found = len(usage.holders(self.engine.host.proc, pids, numbers))
        if not found and device is not None and device.uuid and self.engine.config.use_nvml:
            found = len(usage.nvml_pids([device.uuid]) & set(pids))
        return found

    def _reclaim(self, record: ContainerRecord, entry: DeviceRecord, idle_for: float) -> bool:
        """Unmount one idle device under the container's lock, release its holder pod,
        and tell the pod (Event) and the metrics."""
        ref = record.container_id or record.key
        meta = entry.metadata
        namespace, pod_name = meta.get("namespace"), meta.get("pod")
        key = clock_key(record.key, entry)
        try:
            with self.locks.hold(ref):
                now = self.engine.ledger.load(record.key)
                current = now.devices.get(entry.key) if now else None
                if current is None or current.mounted_at != entry.mounted_at:
                    return False  # unmounted (or mounted anew) meanwhile
                before = self.holders.named_in(ref)
                self.engine.unmount(ref, [entry.key], force=False)
                released: list[str] = []
                if namespace:
                    try:
                        released = self.holders.release(namespace, before)
                    except ApiError as exc:
                        log.warning("reclaim: holder pod release: %s", exc.message)
        except DeviceBusy as exc:
            self._idle.observe(key, 1, time.monotonic())  # opened meanwhile: held again
            log.info(
                "reclaim of %s from %s: in use, its idle clock restarts: %s",
                entry.key,
                ref,
                exc.message,
            )
            return False
        except HotmountError as exc:
            log.warning("cannot reclaim %s from %s: %s", entry.key, ref, exc.message)
            return False
        self._idle.forget(key)
        self.metrics.reclaimed.inc()
        timeout = idle.timeout_of(meta) or 0
        why = (
            f"idle for {idle.format_duration(idle_for)} (idle timeout "
            f"{idle.format_duration(timeout)})"
        )
        label = self._device_text(entry.key)
        log.info("reclaimed %s from %s: %s; holder pods deleted: %s", label, ref, why, released)
        if namespace and pod_name and self.kube is not None:
            try:
                pod = self.kube.find_pod(namespace, pod_name)
            except ApiError:
                pod = None
            if pod is not None:
                container = meta.get("container") or ref
                record_event(
                    self.kube, pod, "GPUReclaimed", f"took {label} back from {container}: {why}"
                )
        return True

    def _device_text(self, key: str) -> str:
        device = self.engine.inventory.get(key)
        return f"GPU {device_label(device)}" if device is not None else key
