"""The new mount API, through ctypes: the only module here that mounts or unmounts.

A running container cannot be given a bind mount with mount(2) from the host: a
plain path through /proc/<pid>/root follows the container's symlinks against the
host's root. Instead (kernel 5.12+ for mount_setattr):

1. `open_tree(OPEN_TREE_CLONE)` of the host file, from an fd opened safely: a
   detached copy of the mount, made read-only, nosuid, nodev with `mount_setattr`;
2. a forked child (setns of a mount namespace is refused in a multi-threaded
   process) enters the container's mount namespace and `move_mount`s the copy onto
   an fd of the target that the parent opened with openat2(RESOLVE_IN_ROOT): no path
   is resolved in the child at all;
3. unmount: the child `fchdir`s to the target's directory (an fd opened the same
   careful way) and `umount2(name, UMOUNT_NOFOLLOW)`; a busy mount (a process has
   the library mapped) is detached lazily (MNT_DETACH), so that process keeps it.
"""

from __future__ import annotations

import ctypes
import errno
import os
from collections.abc import Callable

from hotmount.errors import ContainerNotFound, KernelError
from hotmount.tenantfs import forked

SYS_OPEN_TREE, SYS_MOVE_MOUNT, SYS_MOUNT_SETATTR = 428, 429, 442  # x86_64 and aarch64
OPEN_TREE_CLONE = 1
AT_EMPTY_PATH = 0x1000
AT_RECURSIVE = 0x8000
MOVE_MOUNT_F_EMPTY_PATH = 0x04
MOVE_MOUNT_T_EMPTY_PATH = 0x40
MOUNT_ATTR_RDONLY, MOUNT_ATTR_NOSUID, MOUNT_ATTR_NODEV = 0x1, 0x2, 0x4
MS_PRIVATE = 1 << 18  # include/uapi/linux/mount.h
MNT_DETACH, UMOUNT_NOFOLLOW = 0x2, 0x8
CLONE_NEWNS = 0x00020000
CLONE_FS = 0x00000200


class _MountAttr(ctypes.Structure):  # include/uapi/linux/mount.h: struct mount_attr
    _fields_ = [
        ("attr_set", ctypes.c_uint64),
        ("attr_clr", ctypes.c_uint64),
        ("propagation", ctypes.c_uint64),
        ("userns_fd", ctypes.c_uint64),
    ]


# The process's own symbols, libc among them: find_library("c") would run ldconfig at import.
_libc = ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> int:
    if result < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")
    return result


def readonly_copy(source_fd: int) -> int:
    """A detached, read-only (nosuid, nodev) bind of the file or directory `source_fd`."""
    flags = OPEN_TREE_CLONE | os.O_CLOEXEC | AT_EMPTY_PATH
    tree = _check(_libc.syscall(SYS_OPEN_TREE, source_fd, b"", flags), "open_tree")
    # Private: a clone of a shared source would join its peer group, and a mount the
    # container made over its copy would propagate onto the host's own file.
    attr = _MountAttr(
        attr_set=MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV, propagation=MS_PRIVATE
    )
    try:
        _check(
            _libc.syscall(
                SYS_MOUNT_SETATTR, tree, b"", AT_EMPTY_PATH | AT_RECURSIVE,
                ctypes.byref(attr), ctypes.sizeof(attr),
            ),
            "mount_setattr",
        )  # fmt: skip
    except BaseException:
        os.close(tree)
        raise
    return tree


def attach(ns_fd: int, tree_fd: int, target_fd: int) -> None:
    """Move the detached `tree_fd` onto `target_fd`, inside the namespace `ns_fd`."""
    _in_namespace(ns_fd, lambda: _move(tree_fd, target_fd), keep=(tree_fd, target_fd))


def detach(ns_fd: int, dir_fd: int, name: str) -> bool:
    """Unmount `name` in the directory `dir_fd` inside the namespace; True when it was
    busy and was detached lazily. An absent mount is not an error."""
    return _in_namespace(ns_fd, lambda: _umount(dir_fd, name), keep=(dir_fd,)) == 1


def _move(tree_fd: int, target_fd: int) -> int:
    flags = MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH
    _check(_libc.syscall(SYS_MOVE_MOUNT, tree_fd, b"", target_fd, b"", flags), "move_mount")
    return 0


def _umount(dir_fd: int, name: str) -> int:
    os.fchdir(dir_fd)
    if _libc.umount2(name.encode(), UMOUNT_NOFOLLOW) == 0:
        return 0
    err = ctypes.get_errno()
    if err == errno.EINVAL:  # not a mount point (gone already)
        return 0
    if err != errno.EBUSY:
        raise OSError(err, f"umount2: {os.strerror(err)}")
    _check(_libc.umount2(name.encode(), UMOUNT_NOFOLLOW | MNT_DETACH), "umount2(MNT_DETACH)")
    return 1


def _in_namespace(ns_fd: int, work: Callable[[], int], keep: tuple[int, ...]) -> int:
    """Run `work` in a forked child inside the mount namespace (hotmount/tenantfs/forked.py: its
    other fds closed, a deadline, a kill); its errno comes back."""

    def in_namespace() -> int:  # pragma: no cover - runs in the child
        # A library's fork handler (grpc's) may start threads in the child; they
        # share its fs_struct, and setns of a mount namespace refuses a shared one.
        if _libc.unshare(CLONE_FS) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"unshare(CLONE_FS): {os.strerror(err)}")
        if _libc.setns(ns_fd, CLONE_NEWNS) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns: {os.strerror(err)}")
        return work()

    try:
        return forked.run(in_namespace, "a step in the container's mount namespace",
                          keep=(ns_fd, *keep))  # fmt: skip
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ESRCH):
            raise ContainerNotFound(
                f"the container went away during a mount: {exc.strerror}"
            ) from exc
        raise KernelError(f"in the container's mount namespace: {exc.strerror}") from exc
