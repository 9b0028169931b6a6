"""Which character devices a container's processes hold open, without hanging on a
tenant's filesystem, and in bounded time and memory whatever the tenant holds open.

`stat("/proc/PID/fd/N")` follows the fd into the file: on a volume whose NFS server
the tenant stopped, or on a FUSE server that never answers, it blocks for ever. So
each fd is looked at in steps that touch no filesystem first:

1. `readlink` of the fd (procfs prints the path it has; it asks the file's filesystem
   nothing): a target that is not a path (`pipe:[..]`, `socket:[..]`, `anon_inode:..`)
   is no device node;
2. the fd's mount, by `mnt_id` in `/proc/PID/fdinfo/N`, looked up in the process's
   own `/proc/PID/mountinfo` (both printed from the kernel's memory): a mount with
   `nodev` cannot have given anyone an open device, so it is skipped; a filesystem that
   answers `stat` from memory or a local disk (tmpfs, devtmpfs, overlay, ext4, ...)
   is stat'ed. The path is not trusted for this: a tenant can name a FUSE file
   `/dev/anything` in its own mount namespace, and the mount says what it is;
3. a dev-capable mount of any other filesystem (NFS, FUSE, CIFS, ...) may hold a device
   node the tenant made, so it is stat'ed too, but last and apart, one process per call
   to a child of its own: if it does not answer in time, that process and those after
   it are not classified (below), naming their files.

Both passes run in killable children with a deadline, kept for the next scan
(hotmount/tenantfs/workers.py: an unmount does not pay a fork): a tenant that swaps an fd
between step 2 and the stat (a race) costs one failed scan, not the agent. That race
is why even the scan of local files is not done in the agent's own process: the mount
read from fdinfo is the fd's a moment before the stat follows it, and a stat that
blocks there could never be killed.

A tenant can also make the scan long rather than hung: each fd costs tens of
microseconds, and a few processes holding hundreds of thousands of dup'd fds each
outlast any deadline. So a scan never depends on finishing (issue 40):

- each pass stops looking after a budget (`BUDGET_SHARE` of the deadline) and answers
  what it knows: the holders it found, and the processes it could not finish
  (`Scan.unclassified`, with `why`); a pass killed at its deadline leaves every process
  it was asked about unclassified. What callers do with that is hotmount/host/usage.py's;
- processes are looked at smallest fd table first (`FDSize`), so the ones that flood
  are left over, not the others;
- what one answer carries is bounded whatever the container holds open: a holder's
  paths are deduplicated and at most `PATHS_PER_PID` are named (at most `MAX_NAMED` in
  all, each cut at `MAX_PATH` characters; the other holders come by PID alone), and at
  most `MAX_REMOTE` fds go to the second pass (past that, their processes are
  unclassified). A reply used to carry one entry per fd: ~157 MB in the agent per
  million dup'd fds of the GPU.
"""

from __future__ import annotations

import os
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path

from hotmount.errors import ChildTimeout
from hotmount.tenantfs import forked, workers
from hotmount.tenantfs.mounts import LOCAL_FILESYSTEMS, MountTable, mnt_id
from hotmount.tenantfs.procfs import OpenFds, fd_table_size

BUDGET_SHARE = 0.5  # of the deadline: a pass stops looking then and answers what it knows
PATHS_PER_PID = 4  # distinct paths named per holder (it is a holder from the first)
MAX_NAMED = 256  # (PID, path) pairs in one answer; further holders come by PID alone
MAX_PATH = 256  # characters of a path kept for messages
MAX_REMOTE = 8192  # fds one scan hands to the second pass
_SHOWN = 5  # processes or files a reason names


@dataclass(frozen=True)
class Scan:
    """One look at the open files of some processes.

    `found`: (PID, path) of holders, a few distinct paths each; `holders`: every holder's
    PID (those past `MAX_NAMED` have no path in `found`); `unclassified`: PIDs whose
    open files were not all looked at, nor found holding, and `why`."""

    found: list[tuple[int, str]] = field(default_factory=list)
    holders: list[int] = field(default_factory=list)
    unclassified: list[int] = field(default_factory=list)
    why: str = ""

    @property
    def complete(self) -> bool:
        return not self.unclassified

    def named_holders(self) -> list[tuple[int, str]]:
        """`found`, and ("" for the path) each holder past `MAX_NAMED`."""
        named = {pid for pid, _ in self.found}
        return self.found + [(pid, "") for pid in self.holders if pid not in named]


def scan(proc: Path, pids: list[int], numbers: set[tuple[int, int]]) -> Scan:
    """Who among `pids` holds a character device in `numbers` open, as far as the budget
    goes; never fails for lack of time (what is left is `unclassified`)."""
    if not pids or not numbers:
        return Scan()
    seconds = forked.DEFAULT_DEADLINE
    budget = seconds * BUDGET_SHARE
    try:
        named, holders, left, why, remote = workers.call(
            _scan,
            (proc, pids, numbers, time.monotonic() + budget, budget),
            "the scan of the container's open files",
            seconds,
        )
    except ChildTimeout as exc:
        return Scan(unclassified=sorted(set(pids)), why=exc.message)
    reasons = [why] if why else []
    if remote.fds:
        more, more_holders, late, detail = _second_pass(proc, remote, numbers, seconds, budget)
        if late:
            shown = [(p, *remote.shown[p]) for p in late if p in remote.shown][:_SHOWN]
            files = ", ".join(f"PID {p} {target} ({fstype})" for p, target, fstype in shown)
            reasons.append(f"open files on a filesystem that does not answer: {files} ({detail})")
        named = list(dict.fromkeys(named + more))[:MAX_NAMED]
        holders = [*holders, *more_holders]
        left = [*left, *late]
    held = set(holders)
    left = sorted(set(left) - held)
    return Scan(sorted(named), sorted(held), left, "; ".join(reasons) if left else "")


def _second_pass(
    proc: Path, remote: _Remote, numbers: set[tuple[int, int]], seconds: float, budget: float
) -> tuple[list[tuple[int, str]], list[int], list[int], str]:
    """The fds on mounts that may not answer, stat'ed one process per call, in the first
    pass's order: a file that hangs costs the worker that stats it and leaves its process
    and those after it unclassified, not the processes already looked at. The whole pass
    stops looking after `budget` and waits `seconds` at most, as one call would.
    (named holders, holder PIDs, PIDs not looked at, why not)."""
    by_pid: dict[int, list[tuple[int, int]]] = {}
    for pid, fd in remote.fds:
        by_pid.setdefault(pid, []).append((pid, fd))
    start = time.monotonic()
    stop_at, end = start + budget, start + seconds
    named: list[tuple[int, str]] = []
    holders: list[int] = []
    late: list[int] = []
    detail = ""
    order = list(by_pid)
    for i, pid in enumerate(order):
        wait = end - time.monotonic()
        if wait <= 0 or time.monotonic() >= stop_at:
            late += order[i:]
            detail = f"not all answered within {budget:g}s"
            break
        try:
            more, more_holders, missed = workers.call(
                _stat_remote,
                (proc, by_pid[pid], numbers, stop_at),
                "a look at open files on network or FUSE mounts",
                wait,
            )
        except ChildTimeout as exc:
            late += order[i:]
            detail = exc.message
            break
        named += more
        holders += more_holders
        if missed:
            late += [*missed, *order[i + 1 :]]
            detail = f"not all answered within {budget:g}s"
            break
    return named, holders, late, detail


@dataclass
class _Remote:
    """fds on dev-capable mounts of filesystems that may not answer: (PID, fd) each, and
    one of each process's (target, filesystem type) for a message (the first few)."""

    fds: list[tuple[int, int]] = field(default_factory=list)
    shown: dict[int, tuple[str, str]] = field(default_factory=dict)


class _Found:
    """Holders as the worker finds them, bounded: see the module's docstring."""

    def __init__(self) -> None:
        self.named: list[tuple[int, str]] = []
        self.holders: dict[int, set[str]] = {}

    def add(self, pid: int, target: str) -> bool:
        """Note `pid` holds `target`; True once it has `PATHS_PER_PID` distinct paths."""
        paths = self.holders.setdefault(pid, set())
        path = target[:MAX_PATH]
        if path not in paths and len(paths) < PATHS_PER_PID:
            paths.add(path)
            if len(self.named) < MAX_NAMED:
                self.named.append((pid, path))
        return len(paths) >= PATHS_PER_PID


def _scan(
    proc: Path, pids: list[int], numbers: set[tuple[int, int]], stop_at: float, budget: float
) -> tuple[list[tuple[int, str]], list[int], list[int], str, _Remote]:  # pragma: no cover
    """(named holders, holder PIDs, unclassified PIDs, why, fds for the second pass)."""
    found = _Found()
    remote = _Remote()
    unclassified: list[int] = []
    reasons: list[str] = []
    tables: dict[str, MountTable] = {}
    order = sorted(pids, key=lambda p: _fd_table_size(proc, p))
    for i, pid in enumerate(order):
        if time.monotonic() >= stop_at:
            unclassified += order[i:]
            reasons.append(_out_of_time(proc, order[i:], budget))
            break
        outcome = _scan_one(proc, pid, numbers, stop_at, found, remote, tables)
        if outcome == "time":
            unclassified += [p for p in order[i:] if p not in found.holders]
            reasons.append(_out_of_time(proc, order[i:], budget))
            break
        if outcome == "remote" and pid not in found.holders:
            unclassified.append(pid)
            reasons.append(f"PID {pid} has more open files on network or FUSE mounts than "
                           f"one scan looks at ({MAX_REMOTE})")  # fmt: skip
    return found.named, sorted(found.holders), unclassified, "; ".join(reasons), remote


def _scan_one(
    proc: Path,
    pid: int,
    numbers: set[tuple[int, int]],
    stop_at: float,
    found: _Found,
    remote: _Remote,
    tables: dict[str, MountTable],
) -> str:  # pragma: no cover - runs in a child
    """Look at one process's fds: "done", or why not all: "time", "remote"."""
    fds = OpenFds(proc, pid)
    try:
        ns = fds.mount_namespace()
        mounts = tables.get(ns)
        if mounts is None:
            mounts = tables[ns] = MountTable(fds.mountinfo())
        entries = fds.names()  # streamed: no list of every fd
    except OSError:
        return "done"  # exited, or a kernel thread
    mark = len(remote.fds)
    with entries:
        for entry in entries:
            if time.monotonic() >= stop_at:
                return "time"
            name = entry.name
            try:
                target = fds.target(name)
                if not target.startswith("/"):
                    continue  # pipe:[..], socket:[..], anon_inode:..: no device node
                mount_id = mnt_id(fds.fdinfo(name))
            except OSError:
                continue  # closed meanwhile
            mount = mounts.get(mount_id)
            if mount is not None and mount.nodev:
                continue
            if mount is None or mount.fstype not in LOCAL_FILESYSTEMS:
                if len(remote.fds) >= MAX_REMOTE:
                    del remote.fds[mark:]  # its others go too: it is unclassified anyway
                    return "remote"
                remote.fds.append((pid, int(name)))
                if pid not in remote.shown and len(remote.shown) < MAX_NAMED:
                    fstype = mount.fstype if mount else "unknown"
                    remote.shown[pid] = (target[:MAX_PATH], fstype)
                continue
            if _holds(fds, name, numbers) and found.add(pid, target):
                del remote.fds[mark:]  # a holder already: nothing more to learn
                return "done"
    return "done"


def _stat_remote(
    proc: Path, fds: list[tuple[int, int]], numbers: set[tuple[int, int]], stop_at: float
) -> tuple[list[tuple[int, str]], list[int], list[int]]:  # pragma: no cover - runs in a child
    """(named holders, holder PIDs, PIDs not looked at in time) among `fds`."""
    found = _Found()
    for i, (pid, fd) in enumerate(fds):
        if time.monotonic() >= stop_at:
            late = {p for p, _ in fds[i:]} - set(found.holders)
            return found.named, sorted(found.holders), sorted(late)
        opened = OpenFds(proc, pid)
        if _holds(opened, fd, numbers):
            try:
                target = opened.target(fd)
            except OSError:
                target = f"fd {fd}"
            found.add(pid, target)
    return found.named, sorted(found.holders), []


def _holds(fds: OpenFds, fd: int | str, numbers: set[tuple[int, int]]) -> bool:  # pragma: no cover
    try:
        st = fds.follow(fd)  # follows the magic link to the open file: in a child only
    except OSError:
        return False
    if not stat.S_ISCHR(st.st_mode):
        return False
    return (os.major(st.st_rdev), os.minor(st.st_rdev)) in numbers


def _fd_table_size(proc: Path, pid: int) -> int:  # pragma: no cover - runs in a child
    return fd_table_size(proc, pid)


def _out_of_time(proc: Path, pids: list[int], budget: float) -> str:  # pragma: no cover
    """Why `pids` were left: the budget, and the largest fd tables among them."""
    sizes = sorted(((_fd_table_size(proc, p), p) for p in pids), reverse=True)[:_SHOWN]
    tables = ", ".join(f"PID {p}: {n}" for n, p in sizes)
    return f"the look stopped at its budget of {budget:g}s (largest fd tables: {tables})"
