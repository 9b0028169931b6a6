"""What mount a file descriptor is on, and what that mount is, from procfs alone.

`/proc/PID/fdinfo/N` (its `mnt_id`) and `/proc/PID/mountinfo` are printed from the
kernel's memory: reading them asks the file's own filesystem nothing, so they answer
even where the filesystem would not (an NFS share whose server the tenant stopped, a
FUSE server that never answers). Used by the scan for holders (hotmount/tenantfs/openfiles.py)
and by device-node work, which refuses a container's /dev that is not local
(hotmount/tenantfs/devnodes.py).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

# Filesystems whose getattr answers from memory or a local disk.
LOCAL_FILESYSTEMS = frozenset(
    {"tmpfs", "devtmpfs", "ramfs", "overlay", "ext2", "ext3", "ext4", "xfs", "btrfs",
     "squashfs", "erofs", "vfat", "zfs", "proc", "sysfs", "devpts", "mqueue", "hugetlbfs"}
)  # fmt: skip


@dataclass(frozen=True)
class Mount:
    fstype: str
    nodev: bool


def mnt_id(fdinfo: str, dir_fd: int | None = None) -> int | None:
    """The `mnt_id` in an fdinfo file (`/proc/PID/fdinfo/N`, or `N` in `dir_fd`)."""
    fd = os.open(fdinfo, os.O_RDONLY | os.O_CLOEXEC, dir_fd=dir_fd)
    try:
        text = os.read(fd, 4096)
    finally:
        os.close(fd)
    at = text.find(b"mnt_id:")
    return None if at < 0 else int(text[at + 7 :].split(None, 1)[0])


def mount_of(mountinfo: str, mnt_id: int | None, dir_fd: int | None = None) -> Mount | None:
    """One mount of a mountinfo (`mountinfo` in `dir_fd`, a pinned /proc/PID, where
    given), read only as far as its line: the kernel prints the lines as they are read,
    and a container's /dev comes third (its line costs a quarter of the whole file's
    ~50 µs: this is on every node operation's path)."""
    if mnt_id is None:
        return None
    try:
        fd = os.open(mountinfo, os.O_RDONLY | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError:
        return None
    key, text, at = b"\n%d " % mnt_id, b"\n", -1
    try:
        while True:
            chunk = os.read(fd, 1024)
            text += chunk
            if at < 0:
                at = text.find(key)
            if at >= 0:
                end = text.find(b"\n", at + 1)
                if end >= 0 or not chunk:
                    return _parse(text[at + 1 : end if end >= 0 else None])
            if not chunk:
                return None
    except OSError:
        return None
    finally:
        os.close(fd)


def _parse(line: bytes) -> Mount | None:
    """A mountinfo line: `ID PARENT MAJ:MIN ROOT POINT OPTIONS [TAGS...] - FSTYPE ...`."""
    fields = line.split()
    try:
        fstype = fields[fields.index(b"-", 6) + 1].decode()
    except (ValueError, IndexError):
        return None
    return Mount(fstype, b"nodev" in fields[5].split(b","))


class MountTable:
    """One mountinfo (proc(5)), read once; a mount's line parsed only when asked for
    (a scan looks up a few mounts of a table of hundreds)."""

    def __init__(self, mountinfo: str) -> None:
        self._path = mountinfo
        self._text: bytes | None = None
        self._parsed: dict[int, Mount | None] = {}

    def get(self, mnt_id: int | None) -> Mount | None:
        """The mount with this ID (filesystem type, nodev); None where it is not here."""
        if mnt_id is None:
            return None
        if mnt_id not in self._parsed:
            self._parsed[mnt_id] = self._parse(mnt_id)
        return self._parsed[mnt_id]

    def _parse(self, mnt_id: int) -> Mount | None:
        if self._text is None:
            try:
                with open(self._path, "rb") as info:
                    self._text = b"\n" + info.read()
            except OSError:
                self._text = b""
        at = self._text.find(b"\n%d " % mnt_id)
        if at < 0:
            return None
        return _parse(self._text[at + 1 : self._text.find(b"\n", at + 1)])
