"""The driver's steps over a container's CUDA processes, each undone as a whole: lock all
or none, checkpoint all or none, restore all or hand back the ones restored.

No ledger and no mounts here: hotmount/engine/suspension.py records each step before it
runs and decides what a failure leaves. Lock and checkpoint name a process to the driver
by host PID only right after its pidfd (`Pinned`, opened before the scan) shows it
alive; restore is given only the processes the caller found still there (the same start
time, in the container)."""

from __future__ import annotations

import logging
from collections.abc import Callable

from hotmount.errors import HotmountError, KernelError
from hotmount.host.usage import Pinned
from hotmount.state.ledger import CudaProcess
from hotmount.suspend.choose import ProcessWontLock, RestoreFailed
from hotmount.suspend.cuda import CheckpointApi, CudaError

log = logging.getLogger(__name__)

# Each step as it happens (`locked`, `checkpointed`, `restored`, `unlocked`) and its
# details: what a caller polling the progress of a suspend or resume reads.
Progress = Callable[[str, dict[str, object]], None]


def lock_all(
    api: CheckpointApi,
    pinned: Pinned,
    processes: list[CudaProcess],
    timeout: float,
    progress: Progress,
) -> None:
    """Lock each process (a bounded wait for its GPU work to drain); if one will not,
    unlock those locked before and raise ProcessWontLock."""
    locked: list[CudaProcess] = []
    for process in processes:
        try:
            check_pinned(pinned, process.pid)
            api.lock(process.pid, timeout)
        except (CudaError, KernelError) as exc:
            for done in reversed(locked):
                attempt(api.unlock, done.pid)
            raise ProcessWontLock(
                f"PID {process.pid} did not lock within {timeout:g}s ({exc.message}); "
                "every process locked before was unlocked, nothing was changed"
            ) from exc
        locked.append(process)
        progress("locked", {"pid": process.pid})


def checkpoint_all(
    api: CheckpointApi,
    pinned: Pinned,
    processes: list[CudaProcess],
    progress: Progress,
) -> None:
    """Checkpoint each locked process (its GPU memory into host memory); if one fails,
    restore those checkpointed before, unlock them all, and raise KernelError."""
    for i, process in enumerate(processes):
        try:
            check_pinned(pinned, process.pid)
            api.checkpoint(process.pid)
        except (CudaError, KernelError) as exc:
            for done in processes[:i]:
                attempt(api.restore, done.pid, [])
            for done in processes:
                attempt(api.unlock, done.pid)
            raise KernelError(
                f"checkpointing PID {process.pid} failed ({exc.message}); every process "
                "was restored and unlocked, nothing was changed"
            ) from exc
        progress("checkpointed", {"pid": process.pid, "gpuBytes": process.gpu_bytes})


def restore_all(
    api: CheckpointApi,
    processes: list[CudaProcess],
    pairs: list[tuple[str, str]],
    progress: Progress,
    undo: Callable[[list[CudaProcess]], None],
) -> None:
    """Restore each process still there onto the GPUs `pairs` maps its old UUIDs to, then
    unlock them. A failed restore calls `undo` with those restored so far (the caller
    checkpoints them again and unmounts) and raises RestoreFailed."""
    restored: list[CudaProcess] = []
    for process in processes:
        state = attempt(api.state, process.pid)
        try:
            if state == "checkpointed":
                api.restore(process.pid, pairs)
        except (CudaError, KernelError) as exc:
            undo(restored)
            raise RestoreFailed(
                f"restoring PID {process.pid} failed: {exc.message}; the process stays "
                "suspended and the GPU was unmounted"
            ) from exc
        restored.append(process)
        progress("restored", {"pid": process.pid, "gpuBytes": process.gpu_bytes})
    for process in restored:
        if attempt(api.state, process.pid) == "locked":
            api.unlock(process.pid)
        progress("unlocked", {"pid": process.pid})


def check_pinned(pinned: Pinned, pid: int) -> None:
    """The process the driver is about to be told of by PID is the one pinned, alive."""
    if pid not in pinned.pids or not pinned.alive(pid):
        raise KernelError(f"PID {pid} has exited")


def attempt(call: Callable[..., object], *args: object) -> object:
    """A step of a rollback: its failure is logged, and the rollback goes on."""
    try:
        return call(*args)
    except HotmountError as exc:
        log.warning("rollback step %s%s: %s", getattr(call, "__name__", call), args, exc.message)
        return None
