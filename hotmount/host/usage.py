"""Who in a container holds a device open, and stopping them when asked to.

Revoking a device stops new `open()`s only: descriptors opened before stay
usable. So unmount looks at `/proc/<pid>/fd` of every process in the container
(and NVML's process list where it loads) before it revokes anything.

That look may not finish: a tenant can hold more fds than a scan gets through before
its deadline, or keep them on a filesystem that does not answer
(hotmount/tenantfs/openfiles.py). Then some processes are *unclassified*: they may hold the
device or not. Without `force` that refuses the unmount (ScanIncomplete), and nothing
changes. With `force` (every take-back is forced) the unmount does not wait for an
answer that may never come: the device is revoked and its nodes removed first, then
the holders found and the unclassified processes are stopped, then a few sweeps stop
whatever got the device's fd since the look (a child inherits its parent's fds; a unix
socket passes them) or cannot be cleared (`Clearance`). A forced unmount that spares
the devices that stay refuses instead (HeldWithStayingDevices): an unclassified
process may use those too.
"""

from __future__ import annotations

import contextlib
import os
import select
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from hotmount.errors import DeviceBusy, HeldWithStayingDevices, Holder, ScanIncomplete
from hotmount.tenantfs import openfiles, procfs, signals

UNLOOKED = "(open files not all looked at)"  # an unclassified process's Holder.path
_UNNAMED = "(a device node; too many holders to name each path)"
_SHOWN = 5  # processes a message names
SWEEPS = 3  # looks after a forced revoke without a complete first look


@dataclass(frozen=True)
class Look:
    """Holders of some devices among processes, as far as one look got: `found` (fd scan,
    then NVML), and `unclassified`: processes whose open files it could not all look at
    (`why`), which may hold the devices or not."""

    found: list[Holder]
    unclassified: list[Holder] = field(default_factory=list)
    why: str = ""

    @property
    def complete(self) -> bool:
        return not self.unclassified

    def error(self, container: str | None = None) -> ScanIncomplete:
        """ScanIncomplete naming the first few unclassified processes and why."""
        whose = f"container {container}'s" if container else "the container's"
        return ScanIncomplete(
            f"could not tell whether {whose} processes hold the device: "
            f"{pids_text(self.unclassified)} not looked at in full: {self.why}",
            self.unclassified,
        )


def pids_text(holders: list[Holder]) -> str:
    """`PIDs 7 (python), 9 (sh) and 3 more`."""
    shown = ", ".join(f"{h.pid} ({h.command})" for h in holders[:_SHOWN])
    extra = len(holders) - _SHOWN
    more = f" and {extra} more" if extra > 0 else ""
    return f"PID{'s' if len(holders) > 1 else ''} {shown}{more}"


def look(proc: Path, pids: Iterable[int], numbers: set[tuple[int, int]]) -> Look:
    """Processes among `pids` with an open fd on a character device in `numbers`, and
    those the scan could not finish.

    The fds are looked at without following them into a filesystem that may never
    answer (a tenant's stopped NFS server, a FUSE server), within a budget, and the
    answer is bounded: hotmount/tenantfs/openfiles.py."""
    found = openfiles.scan(proc, list(pids), numbers)
    return Look(
        [Holder(pid, comm(proc, pid), path or _UNNAMED) for pid, path in found.named_holders()],
        [Holder(pid, comm(proc, pid), UNLOOKED) for pid in found.unclassified],
        found.why,
    )


def holders(proc: Path, pids: Iterable[int], numbers: set[tuple[int, int]]) -> list[Holder]:
    """`look()`'s holders; ScanIncomplete where it could not tell for every process."""
    seen = look(proc, pids, numbers)
    if not seen.complete:
        raise seen.error()
    return seen.found


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
        seen = self.look(proc, numbers)
        if not seen.complete:
            raise seen.error()
        return seen.found

    def look(self, proc: Path, numbers: set[tuple[int, int]]) -> Look:
        """`look()` over the pinned processes, less those that exited meanwhile."""
        seen = look(proc, self.pids, numbers)
        return Look(
            [h for h in seen.found if self.alive(h.pid)],
            [h for h in seen.unclassified if self.alive(h.pid)],
            seen.why,
        )

    def stop(self, pids: Iterable[int], grace: float) -> list[int]:
        """SIGTERM, wait up to `grace` seconds, then SIGKILL, through the pidfds only.

        Returns the PIDs that were signalled; a PID that was never pinned, or whose
        process has exited, is not signalled (whoever holds that number now).
        """
        chosen = {pid: self._pidfds[pid] for pid in set(pids) if pid in self._pidfds}
        return signals.stop(chosen, grace)

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


class Clearance:
    """What `clear_holders` did, and what it leaves for after the revoke.

    `stopped`: the PIDs stopped. Where the look could not finish (`force` only), the
    holders it found and the processes it could not clear (`unclassified`, with `why`)
    are stopped by `after_revoke()`, once the device is revoked and its nodes are gone
    (SIGTERM, `grace`, SIGKILL, through the pidfds taken before the look); then up to
    `SWEEPS` new looks stop at once (SIGKILL) what holds the device or cannot be
    cleared (`swept`). Closing it without `after_revoke()` (the unmount failed) stops
    nothing."""

    def __init__(self, stopped: list[int], rest: _Rest | None = None) -> None:
        self.stopped = stopped
        self.unclassified: list[Holder] = rest.look.unclassified if rest else []
        self.why = rest.look.why if rest else ""
        self.swept: list[int] = []
        self._rest = rest

    def after_revoke(self) -> None:
        rest, self._rest = self._rest, None
        if rest is None:
            return
        try:
            pids = {h.pid for h in rest.look.found + rest.look.unclassified}
            self.stopped += rest.pinned.stop(pids, rest.grace)
        finally:
            rest.pinned.close()
        for _ in range(SWEEPS):
            with Pinned.pin(rest.list_pids) as pinned:
                seen = _pinned_holders(pinned, rest.proc, rest.numbers, rest.uuids)
                left = {h.pid for h in seen.found + seen.unclassified}
                if not left:
                    break
                self.swept += pinned.stop(left, 0.0)
        self.stopped = sorted(set(self.stopped + self.swept))

    def close(self) -> None:
        rest, self._rest = self._rest, None
        if rest is not None:
            rest.pinned.close()

    def __enter__(self) -> Clearance:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass(frozen=True)
class _Rest:
    """A forced unmount's look that could not finish, kept for after the revoke."""

    pinned: Pinned
    look: Look
    grace: float
    proc: Path
    list_pids: Callable[[], Iterable[int]]
    numbers: set[tuple[int, int]]
    uuids: list[str]


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
) -> Clearance:
    """Nothing in `container` may hold the device numbers (or, by NVML, the GPUs `uuids`)
    when it is revoked: DeviceBusy naming each holder (ScanIncomplete where the look
    could not tell), or with `force` stop them (`Clearance.stopped`). pidfds first, then
    the look, then signals through the pidfds: a holder that exits meanwhile cannot pass
    its signal on to whoever gets its PID next.

    `force` never stops a holder that also holds one of `staying_numbers` (or, by NVML,
    uses a GPU of `staying_uuids`): the devices that stay in the container are its too.
    HeldWithStayingDevices names it, and nothing is signalled; so too where a look could
    not finish while such devices stay. Otherwise a look that could not finish does not
    stop a forced unmount: its holders and unclassified processes are left to
    `Clearance.after_revoke()`, for the caller to call once the device is revoked."""
    staying = (staying_numbers or set(), staying_uuids or [])

    def later(pinned: Pinned, seen: Look, stopped: list[int]) -> Clearance:
        return Clearance(stopped, _Rest(pinned, seen, grace, proc, list_pids, numbers, uuids))

    pinned = Pinned.pin(list_pids)
    try:
        first = _pinned_holders(pinned, proc, numbers, uuids)
        if not first.found and first.complete:
            pinned.close()
            return Clearance([])
        if not force:
            if first.found:
                names = ", ".join(f"PID {h.pid} ({h.command}) holds {h.path}" for h in first.found)
                raise DeviceBusy(
                    f"the device is in use in container {container}: {names}", first.found
                )
            raise first.error(container)
        _spare_staying(pinned, proc, container, first, *staying)
        if not first.complete:
            return later(pinned, first, [])
        stopped = pinned.stop({h.pid for h in first.found}, grace)
        pinned.close()
        pinned = Pinned.pin(list_pids)
        still = _pinned_holders(pinned, proc, numbers, uuids)
        if still.found:
            raise DeviceBusy("processes still hold the device after SIGKILL", still.found)
        if not still.complete:
            _spare_staying(pinned, proc, container, still, *staying)
            return later(pinned, still, stopped)
        pinned.close()
        return Clearance(stopped)
    except BaseException:
        pinned.close()
        raise


def _spare_staying(
    pinned: Pinned,
    proc: Path,
    container: str,
    seen: Look,
    numbers: set[tuple[int, int]],
    uuids: list[str],
) -> None:
    """HeldWithStayingDevices where a forced unmount would stop a process that also uses
    a device that stays (`numbers`, `uuids`), or may: it could not be looked at in full
    (nothing is signalled)."""
    if not numbers and not uuids:
        return
    if seen.unclassified:
        raise HeldWithStayingDevices(
            f"not stopping processes in container {container} that may also use devices "
            f"that stay: {pids_text(seen.unclassified)} could not be looked at in full "
            f"({seen.why})",
            seen.unclassified,
        )
    also = _also_staying(pinned, proc, seen.found, numbers, uuids)
    if also:
        raise HeldWithStayingDevices(
            f"not stopping processes in container {container} that also use devices that "
            f"stay: {_also_text(seen.found, also)}",
            [h for h in seen.found if h.pid in {a.pid for a in also}],
        )


_NVML = "(NVML)"  # a Holder's path where NVML, not an fd, says it uses the GPU
_NVML_TEXT = "an NVML context"
_UNLOOKED_TEXT = "perhaps more: its open files were not all looked at"


def _pinned_holders(
    pinned: Pinned, proc: Path, numbers: set[tuple[int, int]], uuids: list[str]
) -> Look:
    """Holders by fd scan, plus the GPUs' NVML processes among the pinned PIDs (known
    holders then, whatever the scan could not finish)."""
    seen = pinned.look(proc, numbers)
    extra = (nvml_pids(uuids) & set(pinned.pids)) - {h.pid for h in seen.found}
    found = seen.found + [Holder(pid, comm(proc, pid), _NVML) for pid in sorted(extra)]
    unclassified = [h for h in seen.unclassified if h.pid not in extra]
    return Look(found, unclassified, seen.why if unclassified else "")


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
    seen = _pinned_holders(pinned, proc, numbers, uuids)
    return [h for h in seen.found + seen.unclassified if h.pid in pids]  # may: unclassified


def _also_text(found: list[Holder], also: list[Holder]) -> str:
    """`PID 7 (python) holds /dev/nvidia3 (leaving) and /dev/nvidia1 (staying)`, each."""

    def uses(holders: list[Holder], pid: int) -> str:
        texts = {_NVML: _NVML_TEXT, UNLOOKED: _UNLOOKED_TEXT}
        paths = [texts.get(h.path, h.path) for h in holders if h.pid == pid]
        return ", ".join(dict.fromkeys(paths))

    parts = []
    for pid in sorted({a.pid for a in also}):
        command = next(h.command for h in found if h.pid == pid)
        parts.append(
            f"PID {pid} ({command}) holds {uses(found, pid)} (leaving) "
            f"and {uses(also, pid)} (staying)"
        )
    return "; ".join(parts)


def comm(proc: Path, pid: int) -> str:
    return procfs.comm(proc, pid)
