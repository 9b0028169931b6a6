"""Put driver files into a running container and take them out, with the nodes' care.

Every container path is resolved by openat2 from the container's root, inside it and
never across a mount (hotmount/tenantfs/rootdirs.py, the one door to a tenant's
files), every host source inside its own root; missing directories are made one by one
the same way. A file
is bind-mounted onto an empty file we created with O_EXCL, through the fd that
creation returned (hotmount/driver/mountapi.py), so a swapped path cannot redirect
it. Anything already at a target that is not our own addition is refused, never
overwritten; removal touches only what is still exactly ours.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import posixpath
import stat
from typing import NamedTuple

from hotmount.driver import elf, mountapi
from hotmount.driver.files import BIND, DriverFile, has_soname, is_firmware, library_dirs
from hotmount.errors import DriverRefused, KernelError, UnsafePath
from hotmount.hostfs import HostRoot
from hotmount.tenantfs import forked
from hotmount.tenantfs.devnodes import describe
from hotmount.tenantfs.resolve import open_at, openat2_available
from hotmount.tenantfs.rootdirs import RootDirs

log = logging.getLogger(__name__)

# The host's files (not a tenant's): a driver root is followed as the host would, and it
# is a mount of its own (the GPU Operator's driver container, a CDI spec's host paths).
_HOST_LINKS = "a driver root and its files are followed as the host itself would"
_HOST_MOUNTS = "a driver root is a mount of its own on the host"
_ABSENT, _PRESENT, _MISMATCH = "absent", "present", "mismatch"
_CACHE_BYTES = 16 << 20
# Every look at or change to the container's files runs in a killable child with a
# deadline (hotmount/tenantfs/forked.py): a volume of the tenant's that never answers (a stopped
# NFS server, a FUSE server) costs that one call, not the agent's reconcile thread.
_BOUNDED = forked.bounded("driver files: work in the container's filesystem")


class HostSources:
    """Host files, each opened inside its own root (the host's `/` or a driver root).

    `host` is where the agent sees the host's `/` (the chart mounts it at /host): a
    source root is resolved inside it with openat2(RESOLVE_IN_ROOT), so a driver root
    that is a symlink on the host (`/run/nvidia/driver -> ...`) is followed as the host
    would, and never to a file of the agent's own container."""

    def __init__(self, host: HostRoot) -> None:
        self.host = host
        self._host_fd: int | None = None
        self._roots: dict[str, int] = {}

    def close(self) -> None:
        for fd in self._roots.values():
            os.close(fd)
        self._roots = {}
        if self._host_fd is not None:
            os.close(self._host_fd)
            self._host_fd = None

    def fds(self) -> list[int]:
        """The fds open now (for a bounded child, which must keep them)."""
        host = [] if self._host_fd is None else [self._host_fd]
        return [*host, *self._roots.values()]

    def root(self, source_root: str) -> int:
        """An O_PATH fd of a source root (a host path), resolved inside the host's `/`."""
        root = self._roots.get(source_root)
        if root is not None:
            return root
        try:
            if self._host_fd is None:
                self._host_fd = os.open(self.host.root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
            root = _host_open(self._host_fd, source_root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as exc:
            raise DriverRefused(f"driver root {source_root}: {exc.strerror}") from exc
        self._roots[source_root] = root
        return root

    def listing(self, source_root: str, directory: str) -> list[str] | None:
        """The entry names of a directory inside a source root; None where it is absent
        or is itself a symlink (usrmerge's /lib: the same files by another name)."""
        flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            fd = _host_open(self.root(source_root), directory, flags)
        except (OSError, DriverRefused):  # no such root (yet) or directory: nothing there
            return None
        try:
            return sorted(os.listdir(fd))
        finally:
            os.close(fd)

    def open(self, file: DriverFile) -> int:
        """An O_PATH fd of a bind's source: a regular file or a directory."""
        root = self.root(file.source_root)
        try:
            fd = _host_open(root, file.source, os.O_PATH | os.O_CLOEXEC)
        except OSError as exc:
            raise DriverRefused(f"host file {file.source}: {exc.strerror}") from exc
        mode = os.fstat(fd).st_mode
        if not (stat.S_ISREG(mode) or (stat.S_ISDIR(mode) and is_firmware(file.path))):
            os.close(fd)
            what = "a regular file" if not is_firmware(file.path) else "a file or directory"
            raise DriverRefused(f"host file {file.source} is not {what}")
        return fd

    def identity(self, file: DriverFile) -> tuple[int, int]:
        fd = self.open(file)
        try:
            st = os.fstat(fd)
            return st.st_dev, st.st_ino
        finally:
            os.close(fd)

    def soname(self, file: DriverFile) -> str | None:
        if ".so" not in posixpath.basename(file.path):
            return None
        path_fd = self.open(file)
        try:  # the O_PATH fd opened again for reading: the same file, no path walked
            fd = os.open(f"/proc/self/fd/{path_fd}", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return None
        finally:
            os.close(path_fd)
        try:
            return elf.soname(lambda offset, size: os.pread(fd, size, offset))
        except OSError:
            return None
        finally:
            os.close(fd)


def _host_open(dirfd: int, path: str, flags: int) -> int:
    """A host file inside its root (`in_root`: its absolute links stay in it)."""
    return open_at(
        dirfd, path, flags, in_root=True, follow_symlinks=_HOST_LINKS, cross_mounts=_HOST_MOUNTS
    )


class DriverPlacer:
    """One container's side: look, place, remove. Close it when done."""

    def __init__(self, proc: str, pid: int, host: HostRoot) -> None:
        if not openat2_available():
            raise DriverRefused("placing driver files needs openat2 (kernel 5.6+)")
        self.fs = RootDirs(proc, pid)
        self.ns_fd = self.fs.ns_fd
        self.sources = HostSources(host)

    def close(self) -> None:
        self.sources.close()
        self.fs.close()

    def fds(self) -> list[int]:
        """What a bounded child needs: the namespace, the roots, the directories open."""
        return [*self.fs.open_fds(), *self.sources.fds()]

    # -- what the container has
    @_BOUNDED
    def libc_dir(self) -> str | None:
        """The first glibc default directory that holds the container's libc.so.6."""
        for directory in library_dirs():
            if self._lstat(directory, "libc.so.6") is not None:
                return directory
        return None

    @_BOUNDED
    def found(self, name: str) -> set[str]:
        return {f"{d}/{name}" for d in library_dirs() if self._lstat(d, name) is not None}

    @_BOUNDED
    def ld_cache(self) -> bytes | None:
        """The container's /etc/ld.so.cache, read (never written, never run).

        The container decides what is there: a FIFO would block an open forever, and a
        device node opened by root on the host side bypasses the container's devices
        cgroup (a watchdog starts on open; a pty slave becomes a controlling terminal).
        So it is looked at through an O_PATH fd, which opens nothing, and only a regular
        file is then opened (through that fd: the same inode), non-blocking, no tty."""
        try:
            path_fd = self.fs.open("/etc/ld.so.cache", os.O_PATH | os.O_CLOEXEC)
        except OSError:
            return None
        try:
            seen = os.fstat(path_fd)
            if not stat.S_ISREG(seen.st_mode):
                return None
            flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
            fd = os.open(f"/proc/self/fd/{path_fd}", flags)
        except OSError:
            return None
        finally:
            os.close(path_fd)
        try:
            now = os.fstat(fd)
            if (now.st_dev, now.st_ino) != (seen.st_dev, seen.st_ino):
                return None
            return os.read(fd, _CACHE_BYTES)
        finally:
            os.close(fd)

    @_BOUNDED
    def auto_brings_driver(self) -> bool:
        """`auto`'s question, in one bounded child (each look alone forked its own, on
        every mount): no libcuda.so.1 where the container's linker would look, and a
        root (and libc directory) that can be written."""
        if has_soname(self.found("libcuda.so.1"), self.ld_cache()):
            return False
        return not self.read_only()

    @_BOUNDED
    def read_only(self) -> bool:
        """Whether the container's root, or the directory of its libc, is mounted
        read-only: nothing can be placed there (`auto` then brings nothing)."""
        fds = [self.fs.root_fd]
        libc = self.libc_dir()
        if libc is not None:
            with contextlib.suppress(UnsafePath, KernelError):
                found = self.fs.directory(libc, create=False)
                if found is not None:
                    fds.append(found)
        try:
            return any(os.fstatvfs(fd).f_flag & os.ST_RDONLY for fd in fds)
        except OSError:
            return False

    @_BOUNDED
    def state(self, file: DriverFile, mounted: Mounted | None = None) -> str:
        """absent, present (exactly ours) or mismatch. `mounted`: what was bound there
        (else the host's file now is what a bind must show)."""
        parent, name = posixpath.split(file.path)
        dirfd = self._dir(parent, create=False)
        if dirfd is None:
            return _ABSENT
        return self._state_at(dirfd, name, file, mounted)

    def _state_at(
        self, dirfd: int, name: str, file: DriverFile, mounted: Mounted | None = None
    ) -> str:
        try:
            st = os.stat(name, dir_fd=dirfd, follow_symlinks=False)
        except FileNotFoundError:
            return _ABSENT
        if file.kind == BIND and mounted is not None:
            same = (st.st_dev, st.st_ino) == (mounted.dev, mounted.ino)
            return _PRESENT if same and _mnt_id(dirfd, name) == mounted.mnt_id else _MISMATCH
        if file.kind == BIND:
            return _PRESENT if (st.st_dev, st.st_ino) == self.sources.identity(file) else _MISMATCH
        if stat.S_ISLNK(st.st_mode) and os.readlink(name, dir_fd=dirfd) == file.source:
            return _PRESENT
        return _MISMATCH

    @_BOUNDED
    def mounted(self, file: DriverFile) -> Mounted | None:
        """What a bind placed at `file.path` is now (None: not there, or a symlink)."""
        parent, name = posixpath.split(file.path)
        dirfd = self._dir(parent, create=False)
        if file.kind != BIND or dirfd is None:
            return None
        try:
            st = os.stat(name, dir_fd=dirfd, follow_symlinks=False)
        except FileNotFoundError:
            return None
        return Mounted(st.st_dev, st.st_ino, _mnt_id(dirfd, name))

    @_BOUNDED
    def check(self, file: DriverFile) -> None:
        """Refuse, before anything changes, a target that holds something else."""
        if self.state(file) == _MISMATCH:
            raise self._refusal(file)

    # -- place
    @_BOUNDED
    def place(self, file: DriverFile) -> bool:
        """Add one file; False when exactly it was there already."""
        parent, name = posixpath.split(file.path)
        dirfd = self._dir(parent, create=True)
        if dirfd is None:  # made, yet not there: a dangling symlink stands in its way
            raise UnsafePath(f"{parent} in the container is not a directory; not touching it")
        state = self._state_at(dirfd, name, file)
        if state == _PRESENT:
            return False
        if state == _MISMATCH:
            raise self._refusal(file)
        if file.kind == BIND:
            self._bind(dirfd, name, file)
        else:
            self._writable(lambda: os.symlink(file.source, name, dir_fd=dirfd), file.path)
        return True

    def _bind(self, dirfd: int, name: str, file: DriverFile) -> None:
        source = self.sources.open(file)
        try:
            is_dir = stat.S_ISDIR(os.fstat(source).st_mode)
            tree = mountapi.readonly_copy(source)
        except OSError as exc:
            os.close(source)
            raise KernelError(f"copying the mount of {file.source}: {exc.strerror}") from exc
        os.close(source)
        try:
            if is_dir:
                self._writable(lambda: os.mkdir(name, 0o755, dir_fd=dirfd), file.path)
                flags = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
                target = os.open(name, flags, dir_fd=dirfd)
            else:
                flags = os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC
                target = self._writable(
                    lambda: os.open(name, flags, 0o644, dir_fd=dirfd), file.path
                )
            try:
                mountapi.attach(self.ns_fd, tree, target)
            except BaseException:
                os.close(target)
                target = -1
                _remove_empty(dirfd, name)
                raise
            finally:
                if target >= 0:
                    os.close(target)
        finally:
            os.close(tree)

    def _writable(self, make: object, path: str) -> int:
        try:
            return make()  # type: ignore[operator, no-any-return]
        except FileExistsError:
            raise UnsafePath(
                f"{path} appeared in the container meanwhile; not touching it"
            ) from None
        except OSError as exc:
            if exc.errno == errno.EROFS:
                raise DriverRefused(
                    f"the container's filesystem at {posixpath.dirname(path)} is read-only: "
                    "its driver files cannot be added (mount the GPU without the driver, "
                    "or start the pod with the NVIDIA runtime)"
                ) from exc
            raise KernelError(f"{path} in the container: {exc.strerror}") from exc

    # -- remove
    @_BOUNDED
    def remove(
        self, file: DriverFile, created: bool, mounted: Mounted | None = None
    ) -> tuple[bool, bool]:
        """Take one addition out if it is still ours: (removed, detached lazily)."""
        parent, name = posixpath.split(file.path)
        dirfd = self._dir(parent, create=False)
        if dirfd is None:
            return False, False
        state = self._state_at(dirfd, name, file, mounted)
        if file.kind != BIND:
            if state != _PRESENT or not created:
                return False, False
            with contextlib.suppress(FileNotFoundError):
                os.unlink(name, dir_fd=dirfd)
            return True, False
        detached = False
        if state == _PRESENT:
            detached = mountapi.detach(self.ns_fd, dirfd, name)
        elif state == _MISMATCH and not _empty(dirfd, name):
            log.warning("leaving %s alone: it is no longer the driver's file", file.path)
            return False, False
        if created:
            _remove_empty(dirfd, name)
        return state == _PRESENT or created, detached

    # -- helpers
    def _dir(self, path: str, create: bool) -> int | None:
        try:
            return self.fs.directory(path, create)
        except OSError as exc:
            if exc.errno == errno.EROFS:
                raise DriverRefused(
                    f"the container's filesystem is read-only: cannot make {path}"
                ) from exc
            raise KernelError(f"{path} in the container: {exc.strerror}") from exc

    def _lstat(self, directory: str, name: str) -> os.stat_result | None:
        try:
            dirfd = self.fs.directory(directory, create=False)
        except (UnsafePath, KernelError):
            return None
        if dirfd is None:
            return None
        try:
            return os.stat(name, dir_fd=dirfd, follow_symlinks=False)
        except OSError:
            return None

    def _refusal(self, file: DriverFile) -> UnsafePath:
        parent, name = posixpath.split(file.path)
        st = self._lstat(parent, name)
        what = describe(st) if st is not None else "something else"
        wanted = "the driver's " + posixpath.basename(file.source)
        if file.kind != BIND:
            wanted = f"a symlink to {file.source}"
        return UnsafePath(
            f"{file.path} in the container is {what}, not {wanted}; refusing to overwrite it"
        )


class Mounted(NamedTuple):
    """A bind as placed: the source's identity and the mount's ID in the container."""

    dev: int
    ino: int
    mnt_id: int | None


def _mnt_id(dirfd: int, name: str) -> int | None:
    """The ID of the mount `name` is on (a bind: its own), from the fd's fdinfo."""
    try:
        fd = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dirfd)
    except OSError:
        return None
    try:
        with open(f"/proc/self/fdinfo/{fd}") as info:
            for line in info:
                if line.startswith("mnt_id:"):
                    return int(line.split()[1])
    except OSError:
        return None
    finally:
        os.close(fd)
    return None


def _empty(dirfd: int, name: str) -> bool:
    try:
        st = os.stat(name, dir_fd=dirfd, follow_symlinks=False)
    except FileNotFoundError:
        return True
    return (stat.S_ISREG(st.st_mode) and st.st_size == 0) or stat.S_ISDIR(st.st_mode)


def _remove_empty(dirfd: int, name: str) -> None:
    """Our mount point, if it is still an empty file or directory (never anything else)."""
    try:
        st = os.stat(name, dir_fd=dirfd, follow_symlinks=False)
    except FileNotFoundError:
        return
    try:
        if stat.S_ISREG(st.st_mode) and st.st_size == 0:
            os.unlink(name, dir_fd=dirfd)
        elif stat.S_ISDIR(st.st_mode):
            os.rmdir(name, dir_fd=dirfd)
    except OSError as exc:
        log.warning("could not remove the mount point %s: %s", name, exc.strerror)
