"""Which character devices a container's processes hold open, without hanging on a
tenant's filesystem.

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
   node the tenant made, so it is stat'ed too, but last and apart, in a child of its
   own: if it does not answer in time the scan fails with `ChildTimeout` naming those
   files (nothing is stopped or revoked on a guess).

Both passes run in killable children with a deadline, kept for the next scan
(hotmount/workers.py: an unmount does not pay a fork): a tenant that swaps an fd
between step 2 and the stat (a race) costs one failed scan, not the agent. That race
is why even the scan of local files is not done in the agent's own process: the mount
read from fdinfo is the fd's a moment before the stat follows it, and a stat that
blocks there could never be killed.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

from hotmount import workers
from hotmount.errors import ChildTimeout
from hotmount.mounts import LOCAL_FILESYSTEMS, MountTable, mnt_id


@dataclass(frozen=True)
class _Remote:
    """An fd on a dev-capable mount of a filesystem that may not answer."""

    pid: int
    fd_path: str
    target: str
    fstype: str


def holding(proc: Path, pids: list[int], numbers: set[tuple[int, int]]) -> list[tuple[int, str]]:
    """(PID, path) of each fd among `pids` open on a character device in `numbers`."""
    if not pids or not numbers:
        return []
    found, remote = workers.call(
        _scan, (proc, pids, numbers), "the scan of the container's open files"
    )
    if remote:
        try:
            found += workers.call(_stat_remote, (proc, remote, numbers),
                                  "a look at open files on network or FUSE mounts")  # fmt: skip
        except ChildTimeout as exc:
            files = ", ".join(f"PID {r.pid} {r.target} ({r.fstype})" for r in remote[:5])
            raise ChildTimeout(
                f"could not tell whether the container's processes hold the device: "
                f"open files on a filesystem that does not answer: {files} ({exc.message})"
            ) from exc
    return sorted(set(found))


def _scan(
    proc: Path, pids: list[int], numbers: set[tuple[int, int]]
) -> tuple[list[tuple[int, str]], list[_Remote]]:  # pragma: no cover - runs in a child
    found: list[tuple[int, str]] = []
    remote: list[_Remote] = []
    tables: dict[str, MountTable] = {}
    for pid in pids:
        base = os.path.join(proc, str(pid))
        try:
            names = os.listdir(os.path.join(base, "fd"))
            ns = os.readlink(os.path.join(base, "ns", "mnt"))
            mounts = tables.get(ns)
            if mounts is None:
                mounts = tables[ns] = MountTable(os.path.join(base, "mountinfo"))
        except OSError:
            continue  # exited, or a kernel thread
        for name in names:
            fd_path = os.path.join(base, "fd", name)
            try:
                target = os.readlink(fd_path)
                if not target.startswith("/"):
                    continue  # pipe:[..], socket:[..], anon_inode:..: no device node
                mount_id = mnt_id(os.path.join(base, "fdinfo", name))
            except OSError:
                continue  # closed meanwhile
            mount = mounts.get(mount_id)
            if mount is not None and mount.nodev:
                continue
            if mount is None or mount.fstype not in LOCAL_FILESYSTEMS:
                fstype = mount.fstype if mount else "unknown"
                remote.append(_Remote(pid, fd_path, target, fstype))
                continue
            found += _holder(proc, pid, fd_path, target, numbers)
    return found, remote


def _stat_remote(
    proc: Path, remote: list[_Remote], numbers: set[tuple[int, int]]
) -> list[tuple[int, str]]:  # pragma: no cover - runs in a child
    found: list[tuple[int, str]] = []
    for r in remote:
        found += _holder(proc, r.pid, r.fd_path, r.target, numbers)
    return found


def _holder(
    proc: Path, pid: int, fd_path: str, target: str, numbers: set[tuple[int, int]]
) -> list[tuple[int, str]]:  # pragma: no cover - runs in a child
    try:
        st = os.stat(fd_path)  # follows the magic link to the open file
    except OSError:
        return []
    if not stat.S_ISCHR(st.st_mode):
        return []
    if (os.major(st.st_rdev), os.minor(st.st_rdev)) not in numbers:
        return []
    return [(pid, target)]
