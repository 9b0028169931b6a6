"""Idle policy `suspend` (issue 33): the idle reclaim suspends a container's GPUs
(hotmount/suspend/) instead of stopping the processes that hold them.

A suspension takes every hot-mounted GPU of the container at once (its CUDA processes
are locked and checkpointed as a whole), so it runs only when all of them are under
`suspend` and due in the same pass; otherwise it waits, and the pod is told why.

A refused suspension (no room in the container's memory cgroup, a process that will
not lock, a driver older than 550, no libcuda) falls back to the safe thing: nothing is
stopped, the GPU stays mounted, the failure is counted (`refused`), the pod gets a
warning Event with the reason, and the idle clock starts again (a warning comes again
before the next try).

The suspension runs beside the reconcile pass, not in it (agent/common/background.py):
the pass decides under the container's lock, taken only if free, and returns; the
suspension takes that lock again on a thread of its own. Its Event and metrics come
when it is done, in a later pass's time."""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Sequence
from typing import Protocol

from agent.books.holders import HolderPods
from agent.common.background import Background
from agent.common.locks import ContainerLocks
from agent.idle import policy as idle
from agent.idle.clocks import Look
from agent.metrics import Metrics
from hotmount.api import DEFAULT_LOCK_TIMEOUT, ContainerRecord, DeviceRecord, Engine, HotmountError
from hotmount.wire.durations import format_duration

log = logging.getLogger(__name__)


class IdleReclaim(Protocol):
    """What a suspension uses of agent/idle/reclaim.py's IdleReclaim (which calls
    this module, so is not imported back): its public members."""

    @property
    def engine(self) -> Engine: ...
    @property
    def metrics(self) -> Metrics: ...
    @property
    def locks(self) -> ContainerLocks: ...
    @property
    def holders(self) -> HolderPods: ...
    @property
    def background(self) -> Background: ...

    def is_gpu(self, entry: DeviceRecord) -> bool: ...
    def noted(self, key: tuple[str, str, str]) -> bool: ...
    def used_again(self, record: ContainerRecord, entry: DeviceRecord) -> bool: ...
    def restart_clock(self, key: tuple[str, str, str], when: float) -> None: ...
    def forget_clock(self, key: tuple[str, str, str]) -> None: ...
    def device_text(self, key: str) -> str: ...
    def pod_event(
        self, entry: DeviceRecord, reason: str, message: str, warning: bool = False
    ) -> None: ...


def suspend_idle(reclaim: IdleReclaim, looks: Sequence[Look]) -> bool:
    """On the reconcile thread: decide whether one container's idle GPUs (`looks`: all
    due under `suspend` this pass) are suspended now, and if so start the suspension on
    a thread of its own (agent/common/background.py) and return at once: its CUDA lock and
    checkpoint take as long as the tenant's processes make them. Whether it started.

    A container whose lock another holds, or whose suspension still runs, is left for
    the next pass (its GPUs stay due); nothing here waits."""
    record = looks[0].record
    ref = record.container_id or record.key
    if reclaim.background.running(record.key):
        return False
    with reclaim.locks.try_hold(ref) as free:
        if not free:
            log.debug("idle suspend of %s: the container is busy; the next pass", ref)
            return False
        if _changed(reclaim, looks):
            return False  # unmounted (or mounted anew) meanwhile
        now = reclaim.engine.mounts.record(record.key)
        assert now is not None
        gpus = [key for key, entry in now.devices.items() if reclaim.is_gpu(entry)]
        staying = [key for key in gpus if key not in {look.entry.key for look in looks}]
        if staying:
            _wait_for_all(reclaim, looks, staying)
            return False
        for look in looks:
            if not reclaim.noted(look.key) and reclaim.used_again(record, look.entry):
                _restart(reclaim, looks)
                log.info("suspend of %s: used again, its clock restarts", ref)
                return False
    return reclaim.background.start(
        record.key, f"idle suspend of {ref}", functools.partial(_suspend, reclaim, looks)
    )


def _changed(reclaim: IdleReclaim, looks: Sequence[Look]) -> bool:
    """Whether a due mount was unmounted (or mounted anew) since the pass looked."""
    now = reclaim.engine.mounts.record(looks[0].record.key)
    return now is None or any(
        (current := now.devices.get(look.entry.key)) is None
        or current.mounted_at != look.entry.mounted_at
        for look in looks
    )


def _suspend(reclaim: IdleReclaim, looks: Sequence[Look]) -> None:
    """Off the reconcile thread: the suspension itself, under the container's lock (taken
    without waiting: a call that took it since the pass looked goes first, and the next
    pass decides again); then, with the lock released, the holder pods deleted, the
    pod told."""
    record = looks[0].record
    ref = record.container_id or record.key
    try:
        with reclaim.locks.try_hold(ref) as free:
            if not free or _changed(reclaim, looks):
                log.debug("idle suspend of %s: taken or changed meanwhile; the next pass", ref)
                return
            before = reclaim.holders.named_in(ref)
            done = reclaim.engine.suspender.suspend(ref, lock_timeout=DEFAULT_LOCK_TIMEOUT)
    except (HotmountError, OSError) as exc:
        _refused(reclaim, looks, exc.message if isinstance(exc, HotmountError) else str(exc))
        return
    namespace = looks[0].entry.metadata.get("namespace")
    released = reclaim.holders.release_after(namespace, before, "idle suspend", wait=True)
    for look in looks:
        reclaim.forget_clock(look.key)
        reclaim.metrics.reclaimed.inc()
    first = looks[0]
    timeout = idle.timeout_of(first.entry.metadata) or 0
    moved = sum(p["gpuBytes"] or 0 for p in done.processes)
    labels = ", ".join(reclaim.device_text(key) for key in done.devices)
    container = first.entry.metadata.get("container") or ref
    message = (
        f"suspended {labels} of {container}: unused for "
        f"{format_duration(first.now - (first.since or first.now))} (idle timeout "
        f"{format_duration(timeout)}, policy suspend); {len(done.processes)} processes "
        f"kept, {moved >> 20} MiB of GPU memory in host memory; a resume gives a GPU back"
    )
    log.info("%s; holder pods deleted: %s", message, released)
    reclaim.pod_event(first.entry, "GPUSuspended", message)


def _restart(reclaim: IdleReclaim, looks: Sequence[Look]) -> None:
    """Count the mounts as used now: the clock and its warning start again."""
    when = time.time()
    for look in looks:
        reclaim.restart_clock(look.key, when)


def _wait_for_all(reclaim: IdleReclaim, looks: Sequence[Look], staying: list[str]) -> None:
    """Another GPU of the container is not due under `suspend`: suspending would take it
    too. Nothing is done; the pod is told, and the clock starts again."""
    _restart(reclaim, looks)
    reclaim.metrics.reclaim_failures.labels("skipped").inc()
    first = looks[0]
    container = first.entry.metadata.get("container") or first.record.key
    others = ", ".join(reclaim.device_text(key) for key in staying)
    message = (
        f"did not suspend {reclaim.device_text(first.entry.key)} of {container}: a "
        f"suspension takes every GPU of the container, and {others} is not idle under "
        "policy suspend; the idle clock starts again"
    )
    log.info("%s", message)
    reclaim.pod_event(first.entry, "GPUReclaimSkipped", message, warning=True)


def _refused(reclaim: IdleReclaim, looks: Sequence[Look], why: str) -> None:
    """The suspension was refused: nothing stopped, the GPUs stay, the pod is told."""
    _restart(reclaim, looks)
    reclaim.metrics.reclaim_failures.labels("refused").inc()
    first = looks[0]
    container = first.entry.metadata.get("container") or first.record.key
    labels = ", ".join(reclaim.device_text(look.entry.key) for look in looks)
    message = (
        f"could not suspend idle {labels} of {container}: {why}. Nothing was stopped and "
        "the GPU stays mounted; the idle clock starts again"
    )
    log.warning("%s", message)
    reclaim.pod_event(first.entry, "GPUSuspendRefused", message, warning=True)
