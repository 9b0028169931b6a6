"""Who in a container holds a device open, and stopping them when asked to.

Revoking a device stops new `open()`s only: descriptors opened before stay
usable. So unmount looks at `/proc/<pid>/fd` of every process in the container
(and NVML's process list where it loads) before it revokes anything.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from hotmount import openfiles
from hotmount.errors import DeviceBusy, HeldWithStayingDevices, Holder


def holders(proc: Path, pids: Iterable[int], numbers: set[tuple[int, int]]) -> list[Holder]:
    """Processes among `pids` with an open fd on a character device in `numbers`.

    The fds are looked at without following them into a filesystem that may never
    answer (a tenant's stopped NFS server, a FUSE server): hotmount/openfiles.py."""
    held = openfiles.holding(proc, list(pids), numbers)
    return [Holder(pid, comm(proc, pid), path) for pid, path in held]


_nvml_retry_at = 0.0
_NVML_RETRY_SECONDS = 60.0


def nvml_pids(uuids: Iterable[str]) -> set[int]:
    """Host PIDs NVML reports on these GPUs; empty where NVML does not load.

    A failed load is not retried for a minute: dlopen on every unmount costs more
    than the whole rest of it.
    """
    global _nvml_retry_at
    uuids = list(uuids)
    if not uuids or time.monotonic() < _nvml_retry_at:
        return set()
    try:
        import pynvml
    except ImportError:
        _nvml_retry_at = float("inf")
        return set()
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        _nvml_retry_at = time.monotonic() + _NVML_RETRY_SECONDS
        return set()
    pids: set[int] = set()
    try:
        for uuid in uuids:
            try:
                handle = pynvml.nvmlDeviceGetHandleByUUID(uuid)
                for getter in (
                    pynvml.nvmlDeviceGetComputeRunningProcesses,
                    pynvml.nvmlDeviceGetGraphicsRunningProcesses,
                ):
                    pids.update(p.pid for p in getter(handle))
            except pynvml.NVMLError:
                continue
    finally:
        pynvml.nvmlShutdown()
    return pids


class Pinned:
    """pidfds on a container's processes, taken before anything about them is read.

    Scanning `/proc/<pid>/fd` and then signalling by PID would let a process that exits
    in between, its PID then reused by another process anywhere on the node, take the
    signal. So the order is: open a pidfd for every PID in the cgroup, read the cgroup
    again and keep the pidfds whose process is alive and still listed (while a process
    lives, its PID cannot be reused, so that pidfd is the container's process); then
    scan; then signal through the pidfds. A pidfd whose process has gone signals nothing.
    """

    def __init__(self, pidfds: dict[int, int]) -> None:
        self._pidfds = pidfds

    @classmethod
    def pin(cls, list_pids: Callable[[], Iterable[int]]) -> Pinned:
        pidfds: dict[int, int] = {}
        try:
            for pid in set(list_pids()):
                with contextlib.suppress(ProcessLookupError):
                    pidfds[pid] = os.pidfd_open(pid)
            members = set(list_pids())
        except BaseException:
            for fd in pidfds.values():
                os.close(fd)
            raise
        pinned = cls(pidfds)
        for pid in [p for p in pidfds if p not in members or not pinned.alive(p)]:
            os.close(pidfds.pop(pid))
        return pinned

    @property
    def pids(self) -> list[int]:
        return sorted(self._pidfds)

    def holders(self, proc: Path, numbers: set[tuple[int, int]]) -> list[Holder]:
        """`holders()` over the pinned processes, less those that exited meanwhile."""
        found = holders(proc, self.pids, numbers)
        return [h for h in found if self.alive(h.pid)]

    def stop(self, pids: Iterable[int], grace: float) -> list[int]:
        """SIGTERM, wait up to `grace` seconds, then SIGKILL, through the pidfds only.

        Returns the PIDs that were signalled; a PID that was never pinned, or whose
        process has exited, is not signalled (whoever holds that number now).
        """
        chosen = {pid: self._pidfds[pid] for pid in set(pids) if pid in self._pidfds}
        signalled = [pid for pid, fd in chosen.items() if _signal(fd, signal.SIGTERM)]
        remaining = _wait({pid: chosen[pid] for pid in signalled}, grace)
        for pid in remaining:
            _signal(chosen[pid], signal.SIGKILL)
        _wait({pid: chosen[pid] for pid in remaining}, 5.0)
        return sorted(signalled)

    def alive(self, pid: int) -> bool:
        readable, _, _ = select.select([self._pidfds[pid]], [], [], 0)
        return not readable

    def close(self) -> None:
        for fd in self._pidfds.values():
            os.close(fd)
        self._pidfds = {}

    def __enter__(self) -> Pinned:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def clear_holders(
    proc: Path,
    container: str,
    list_pids: Callable[[], Iterable[int]],
    numbers: set[tuple[int, int]],
    uuids: list[str],
    *,
    force: bool,
    grace: float,
    staying_numbers: set[tuple[int, int]] | None = None,
    staying_uuids: list[str] | None = None,
) -> list[int]:
    """Nothing in `container` may hold the device numbers (or, by NVML, the GPUs `uuids`)
    when it is revoked: DeviceBusy naming each holder, or with `force` stop them (the
    PIDs stopped). pidfds first, then the scan, then signals through the pidfds: a holder
    that exits meanwhile cannot pass its signal on to whoever gets its PID next.

    `force` never stops a holder that also holds one of `staying_numbers` (or, by NVML,
    uses a GPU of `staying_uuids`): the devices that stay in the container are its too.
    HeldWithStayingDevices names it, and nothing is signalled."""
    with Pinned.pin(list_pids) as pinned:
        found = _pinned_holders(pinned, proc, numbers, uuids)
        if not found:
            return []
        if not force:
            names = ", ".join(f"PID {h.pid} ({h.command}) holds {h.path}" for h in found)
            raise DeviceBusy(f"the device is in use in container {container}: {names}", found)
        also = _also_staying(pinned, proc, found, staying_numbers or set(), staying_uuids or [])
        if also:
            raise HeldWithStayingDevices(
                f"not stopping processes in container {container} that also use devices that "
                f"stay: {_also_text(found, also)}",
                [h for h in found if h.pid in {a.pid for a in also}],
            )
        stopped = pinned.stop({h.pid for h in found}, grace)
    with Pinned.pin(list_pids) as again:
        still = _pinned_holders(again, proc, numbers, uuids)
    if still:
        raise DeviceBusy("processes still hold the device after SIGKILL", still)
    return stopped


_NVML = "(NVML)"  # a Holder's path where NVML, not an fd, says it uses the GPU
_NVML_TEXT = "an NVML context"


def _pinned_holders(
    pinned: Pinned, proc: Path, numbers: set[tuple[int, int]], uuids: list[str]
) -> list[Holder]:
    """Holders by fd scan, plus the GPUs' NVML processes among the pinned PIDs."""
    found = pinned.holders(proc, numbers)
    extra = (nvml_pids(uuids) & set(pinned.pids)) - {h.pid for h in found}
    found += [Holder(pid, comm(proc, pid), _NVML) for pid in extra]
    return found


def _also_staying(
    pinned: Pinned,
    proc: Path,
    found: list[Holder],
    numbers: set[tuple[int, int]],
    uuids: list[str],
) -> list[Holder]:
    """Of the holders `found`, where they also hold a staying device (`numbers`, `uuids`)."""
    if not numbers and not uuids:
        return []
    pids = {h.pid for h in found}
    return [h for h in _pinned_holders(pinned, proc, numbers, uuids) if h.pid in pids]


def _also_text(found: list[Holder], also: list[Holder]) -> str:
    """`PID 7 (python) holds /dev/nvidia3 (leaving) and /dev/nvidia1 (staying)`, each."""

    def uses(holders: list[Holder], pid: int) -> str:
        paths = [_NVML_TEXT if h.path == _NVML else h.path for h in holders if h.pid == pid]
        return ", ".join(dict.fromkeys(paths))

    parts = []
    for pid in sorted({a.pid for a in also}):
        command = next(h.command for h in found if h.pid == pid)
        parts.append(
            f"PID {pid} ({command}) holds {uses(found, pid)} (leaving) "
            f"and {uses(also, pid)} (staying)"
        )
    return "; ".join(parts)


def _signal(pidfd: int, signum: int) -> bool:
    try:
        signal.pidfd_send_signal(pidfd, signum)
    except ProcessLookupError:
        return False
    return True


def _wait(pidfds: dict[int, int], timeout: float) -> list[int]:
    """Wait until the processes exit; return those still alive at the deadline."""
    poller = select.poll()
    by_fd = {fd: pid for pid, fd in pidfds.items()}
    for fd in by_fd:
        poller.register(fd, select.POLLIN)
    alive = set(by_fd)
    deadline = time.monotonic() + timeout
    while alive:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        for fd, _event in poller.poll(left * 1000):
            alive.discard(fd)
            poller.unregister(fd)
    return sorted(by_fd[fd] for fd in alive)


def comm(proc: Path, pid: int) -> str:
    try:
        return (proc / str(pid) / "comm").read_text().strip()
    except OSError:
        return "?"
