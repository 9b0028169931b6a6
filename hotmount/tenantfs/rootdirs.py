"""Directories anywhere in a container's root filesystem, for the driver's files.

The driver's libraries go where the image's linker looks, and images reach those
directories through their own links (usrmerge's `/lib -> usr/lib`): so, unlike device
nodes, these paths follow the image's symlinks, but inside the container's root
(`RESOLVE_IN_ROOT`: an absolute link starts at the container's `/`, never the host's)
and never across a mount (a volume, an NFS share the tenant can stop, is not where the
driver's files go nor what the placer walks). The root and mount namespace come from
the init pinned by `procfs.ProcessDir`. Everything here runs in the placer's bounded
children (hotmount/driver/place.py): a lookup on the root filesystem can still wait.
"""

from __future__ import annotations

import contextlib
import errno
import os
from pathlib import Path

from hotmount.errors import ContainerNotFound, KernelError, UnsafePath
from hotmount.tenantfs import procfs
from hotmount.tenantfs.resolve import open_at

DIR_MODE = 0o755
# Why paths in the container's root follow its symlinks.
IMAGE_LINKS = "the driver's files go where the image's linker looks, through its own links"


def _split(path: str) -> tuple[str, str]:
    parent, _, name = path.rpartition("/")
    if not name or name in (".", ".."):
        raise UnsafePath(f"{path!r} is not a path")
    return parent or "/", name


class RootDirs:
    """A container's root and mount namespace, and directories in its root, each opened
    by openat2 from the root fd (symlinks resolve inside the root, no mount is crossed),
    `mkdir -p` one level at a time. Close it."""

    def __init__(self, proc: str | Path, pid: int) -> None:
        with procfs.ProcessDir(proc, pid) as process:
            self.root_fd = process.open_root()
            try:
                self.ns_fd = process.open_namespace("mnt")
            except BaseException:
                os.close(self.root_fd)
                raise
        self._dirs: dict[str, int] = {}  # opened once per operation

    def close(self) -> None:
        for fd in self._dirs.values():
            os.close(fd)
        self._dirs = {}
        os.close(self.ns_fd)
        os.close(self.root_fd)

    def open_fds(self) -> list[int]:
        """Every fd kept open (for a bounded child, which must keep them)."""
        return [self.ns_fd, self.root_fd, *self._dirs.values()]

    def open(self, path: str, flags: int) -> int:
        """`path` in the container's root, as the directories are (symlinks inside it,
        no other mount)."""
        return open_at(self.root_fd, path, flags, in_root=True, follow_symlinks=IMAGE_LINKS)

    def directory(self, path: str, create: bool) -> int | None:
        """An O_PATH fd of a directory resolved inside the container (kept until `close`:
        the caller must not close it); mkdir -p when asked."""
        fd = self._dirs.get(path)
        if fd is None:
            fd = self._open_dir(path, create)
            if fd is not None:
                self._dirs[path] = fd
        return fd

    def _open_dir(self, path: str, create: bool) -> int | None:
        try:
            return self.open(path, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        except FileNotFoundError:
            if not create:
                return None
            if path == "/":
                raise UnsafePath("the container has no / directory") from None
        except NotADirectoryError:
            raise UnsafePath(f"{path} in the container is not a directory") from None
        except OSError as exc:
            raise self._error(path, exc) from exc
        parent, name = _split(path)
        parent_fd = self.directory(parent, create=True)
        assert parent_fd is not None
        with contextlib.suppress(FileExistsError):  # made meanwhile: the open checks it
            os.mkdir(name, DIR_MODE, dir_fd=parent_fd)
        return self._open_dir(path, create=False)

    def _error(self, path: str, exc: OSError) -> Exception:
        if exc.errno == errno.EXDEV:
            return UnsafePath(
                f"{path} in the container crosses into another mount (a volume?); "
                "the driver's files go only into the container's own root filesystem"
            )
        if exc.errno in (errno.ESRCH, errno.ENOENT):
            return ContainerNotFound(f"the container exited while {path} was opened")
        return KernelError(f"opening {path} in the container: {exc.strerror}")
