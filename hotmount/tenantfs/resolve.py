"""openat2(2): a path opened from a directory fd, with what it may pass through said.

`open_at` never follows a symlink and never enters another mount, unless the call says
why (`follow_symlinks=`, `cross_mounts=`): a tenant's symlink into a volume, or a
volume it mounted, is how a look into a container reached a filesystem that never
answers (an NFS server it stopped, a FUSE server). A magic link (`/proc/self/fd/N`
inside the container) is never followed.
"""

from __future__ import annotations

import ctypes
import errno
import os

SYS_OPENAT2 = 437  # the same on x86_64 and aarch64
# RESOLVE_* of include/uapi/linux/openat2.h
RESOLVE_NO_XDEV = 0x01
RESOLVE_NO_MAGICLINKS = 0x02
RESOLVE_NO_SYMLINKS = 0x04
RESOLVE_BENEATH = 0x08
RESOLVE_IN_ROOT = 0x10


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


# The process's own symbols, libc among them: find_library("c") would run ldconfig at import.
_libc = ctypes.CDLL(None, use_errno=True)


_HOW_SIZE = ctypes.sizeof(_OpenHow)
_hows: dict[tuple[int, int], _OpenHow] = {}  # the kernel only reads them: one per kind of open


def _openat2(dirfd: int, path: str, flags: int, resolve: int) -> int:
    how = _hows.get((flags, resolve))
    if how is None:
        how = _hows[(flags, resolve)] = _OpenHow(flags=flags, mode=0, resolve=resolve)
    fd = _libc.syscall(SYS_OPENAT2, dirfd, path.encode(), ctypes.byref(how), _HOW_SIZE)
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), path)
    return int(fd)


def resolve_flags(
    *, in_root: bool = False, follow_symlinks: str | None = None, cross_mounts: str | None = None
) -> int:
    """The RESOLVE_* flags of `open_at` (see there)."""
    resolve = RESOLVE_NO_MAGICLINKS | (RESOLVE_IN_ROOT if in_root else RESOLVE_BENEATH)
    if follow_symlinks is None:
        resolve |= RESOLVE_NO_SYMLINKS
    if cross_mounts is None:
        resolve |= RESOLVE_NO_XDEV
    return resolve


def open_at(
    dirfd: int,
    path: str,
    flags: int,
    *,
    in_root: bool = False,
    follow_symlinks: str | None = None,
    cross_mounts: str | None = None,
) -> int:
    """`path` opened from `dirfd` and never out of it: beneath it (`..` past it and
    absolute paths refused), or with `in_root` inside it as a root (an absolute path or
    symlink starts at `dirfd`). No symlink is followed unless `follow_symlinks` says why,
    no other mount entered unless `cross_mounts` says why (ELOOP, EXDEV otherwise)."""
    resolve = resolve_flags(
        in_root=in_root, follow_symlinks=follow_symlinks, cross_mounts=cross_mounts
    )
    return _openat2(dirfd, path, flags, resolve)


_openat2_works: bool | None = None


def openat2_available() -> bool:
    """Probed once: ENOSYS on old kernels, EPERM/ENOSYS under some seccomp profiles."""
    global _openat2_works
    if _openat2_works is None:
        try:
            os.close(_openat2(-100, "/", os.O_PATH | os.O_DIRECTORY, 0))  # AT_FDCWD
            _openat2_works = True
        except OSError as exc:
            if exc.errno not in (errno.ENOSYS, errno.EPERM):
                raise
            _openat2_works = False
    return _openat2_works
