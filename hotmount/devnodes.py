"""Create and remove device nodes inside a container's mount namespace, safely.

A plain path through `/proc/<pid>/root/...` from the host follows the
container's absolute symlinks against the *host's* root (a container with
`/dev/trap -> /` would have us create nodes in the host's `/`). So:

- `Openat2Fs` (kernel 5.6+, no fork): the container root as an O_PATH fd, every
  directory opened with `openat2(RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS)`, then
  `mknodat`/`unlinkat` relative to it.
- `SetnsFs` (fallback): a forked child enters the mount namespace (setns of a
  mount namespace is refused in a multi-threaded process) and works there.

Modes are set without following the path again: chmod through
`/proc/self/fd/N` of an O_PATH|O_NOFOLLOW fd after `fstat` proved it is the
node we made. An existing path that is not the expected character device is
refused, never overwritten or chmod-ed. Nothing runs from the container image.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import os
import stat
from enum import StrEnum
from pathlib import Path
from typing import Protocol

from hotmount import forked
from hotmount.devices.model import DeviceNode
from hotmount.errors import ContainerNotFound, KernelError, UnsafePath

SYS_OPENAT2 = 437  # the same on x86_64 and aarch64
RESOLVE_NO_XDEV = 0x01
RESOLVE_NO_MAGICLINKS = 0x02
RESOLVE_IN_ROOT = 0x10
CLONE_NEWNS = 0x00020000
DIR_MODE = 0o755


class NodeState(StrEnum):
    ABSENT = "absent"
    PRESENT = "present"  # the expected character device
    MISMATCH = "mismatch"  # something else is at that path


def classify(st: os.stat_result | None, node: DeviceNode) -> NodeState:
    if st is None:
        return NodeState.ABSENT
    if stat.S_ISCHR(st.st_mode) and st.st_rdev == os.makedev(node.major, node.minor):
        return NodeState.PRESENT
    return NodeState.MISMATCH


def describe(st: os.stat_result) -> str:
    if stat.S_ISLNK(st.st_mode):
        return "a symlink"
    if stat.S_ISREG(st.st_mode):
        return "a regular file"
    if stat.S_ISDIR(st.st_mode):
        return "a directory"
    if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode):
        kind = "character" if stat.S_ISCHR(st.st_mode) else "block"
        return f"{kind} device {os.major(st.st_rdev)}:{os.minor(st.st_rdev)}"
    return "something else"


def _split(path: str) -> tuple[str, str]:
    parent, _, name = path.rpartition("/")
    if not name or name in (".", ".."):
        raise UnsafePath(f"{path!r} is not a node path")
    return parent or "/", name


class ContainerFs(Protocol):
    def state(self, node: DeviceNode) -> NodeState: ...
    def ensure(self, node: DeviceNode) -> bool: ...
    def remove(self, node: DeviceNode) -> bool: ...
    def close(self) -> None: ...


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)


def openat2(dirfd: int, path: str, flags: int, resolve: int) -> int:
    how = _OpenHow(flags=flags, mode=0, resolve=resolve)
    fd = _libc.syscall(SYS_OPENAT2, dirfd, path.encode(), ctypes.byref(how), ctypes.sizeof(how))
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), path)
    return int(fd)


_openat2_works: bool | None = None


def openat2_available() -> bool:
    """Probed once: ENOSYS on old kernels, EPERM/ENOSYS under some seccomp profiles."""
    global _openat2_works
    if _openat2_works is None:
        try:
            os.close(openat2(-100, "/", os.O_PATH | os.O_DIRECTORY, 0))  # AT_FDCWD
            _openat2_works = True
        except OSError as exc:
            if exc.errno not in (errno.ENOSYS, errno.EPERM):
                raise
            _openat2_works = False
    return _openat2_works


def _lstat_at(dirfd: int, name: str) -> os.stat_result | None:
    try:
        return os.stat(name, dir_fd=dirfd, follow_symlinks=False)
    except FileNotFoundError:
        return None


def _refuse(path: str, st: os.stat_result, node: DeviceNode) -> UnsafePath:
    return UnsafePath(
        f"{path} in the container is {describe(st)}, not character device "
        f"{node.major}:{node.minor}; refusing to touch it"
    )


def _make_node(dirfd: int, name: str, node: DeviceNode) -> bool:
    """mknodat + exact mode; False when the expected node was already there."""
    device = os.makedev(node.major, node.minor)
    try:
        os.mknod(name, stat.S_IFCHR | node.file_mode, device, dir_fd=dirfd)
    except FileExistsError:
        st = _lstat_at(dirfd, name)
        if st is not None and classify(st, node) is NodeState.PRESENT:
            return False
        raise _refuse(node.path, st, node) if st else UnsafePath(f"{node.path} vanished") from None
    fd = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dirfd)
    try:
        st = os.fstat(fd)
        if classify(st, node) is not NodeState.PRESENT:
            raise _refuse(node.path, st, node)
        if stat.S_IMODE(st.st_mode) != node.file_mode:  # the umask took bits away
            os.chmod(f"/proc/self/fd/{fd}", node.file_mode)
    finally:
        os.close(fd)
    return True


def _remove_node(dirfd: int, name: str, node: DeviceNode) -> bool:
    st = _lstat_at(dirfd, name)
    if st is None:
        return False
    if classify(st, node) is not NodeState.PRESENT:
        raise _refuse(node.path, st, node)
    try:
        os.unlink(name, dir_fd=dirfd)
    except FileNotFoundError:
        return False
    except OSError as exc:  # EROFS, EBUSY: a KernelError, so reconcile goes on past it
        raise KernelError(f"cannot remove {node.path} in the container: {exc.strerror}") from exc
    return True


class Openat2Fs:
    """The container's filesystem through openat2 from its root fd: no fork, ~10 µs a node."""

    _RESOLVE = RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS

    def __init__(self, proc_pid_dir: Path | str) -> None:
        root = os.path.join(proc_pid_dir, "root")
        try:
            self.root_fd = os.open(root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        except (FileNotFoundError, ProcessLookupError) as exc:
            name = os.path.basename(proc_pid_dir)
            raise ContainerNotFound(f"{name}: the process has exited") from exc
        # Directory fds opened once per operation: every node of a mount is in /dev.
        self._dirs: dict[str, int] = {}

    def close(self) -> None:
        for fd in self._dirs.values():
            os.close(fd)
        self._dirs = {}
        os.close(self.root_fd)

    def open_fds(self) -> list[int]:
        """The directory fds kept open (for a child that must keep them)."""
        return list(self._dirs.values())

    def directory(self, path: str, create: bool) -> int | None:
        """`_dir` for other placers of files (hotmount/driver/place.py)."""
        return self._dir(path, create)

    def _dir(self, path: str, create: bool) -> int | None:
        """An O_PATH fd of a directory resolved inside the container (kept until `close`:
        the caller must not close it); mkdir -p when asked."""
        fd = self._dirs.get(path)
        if fd is None:
            fd = self._open_dir(path, create)
            if fd is not None:
                self._dirs[path] = fd
        return fd

    def _open_dir(self, path: str, create: bool) -> int | None:
        flags = os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC
        try:
            return openat2(self.root_fd, path, flags, self._RESOLVE)
        except FileNotFoundError:
            if not create:
                return None
            if path in ("/", "/dev"):
                raise UnsafePath(f"the container has no {path} directory") from None
        except NotADirectoryError:
            raise UnsafePath(f"{path} in the container is not a directory") from None
        except OSError as exc:
            raise self._error(path, exc) from exc
        parent, name = _split(path)
        parent_fd = self._dir(parent, create=True)
        assert parent_fd is not None
        with contextlib.suppress(FileExistsError):  # made meanwhile: the open checks it
            os.mkdir(name, DIR_MODE, dir_fd=parent_fd)
        return self._open_dir(path, create=False)

    def _error(self, path: str, exc: OSError) -> Exception:
        if exc.errno in (errno.ESRCH, errno.ENOENT):
            return ContainerNotFound(f"the container exited while {path} was opened")
        return KernelError(f"opening {path} in the container: {exc.strerror}")

    def state(self, node: DeviceNode) -> NodeState:
        parent, name = _split(node.path)
        dirfd = self._dir(parent, create=False)
        if dirfd is None:
            return NodeState.ABSENT
        return classify(_lstat_at(dirfd, name), node)

    def ensure(self, node: DeviceNode) -> bool:
        parent, name = _split(node.path)
        dirfd = self._dir(parent, create=True)
        assert dirfd is not None
        return _make_node(dirfd, name, node)

    def remove(self, node: DeviceNode) -> bool:
        parent, name = _split(node.path)
        dirfd = self._dir(parent, create=False)
        if dirfd is None:
            return False
        return _remove_node(dirfd, name, node)


class SetnsFs:
    """Fallback: each operation runs in a forked child inside the mount namespace (~1.6 ms)."""

    def __init__(self, proc_pid_dir: Path) -> None:
        try:
            self.ns_fd = os.open(proc_pid_dir / "ns" / "mnt", os.O_RDONLY | os.O_CLOEXEC)
        except (FileNotFoundError, ProcessLookupError) as exc:
            raise ContainerNotFound(f"{proc_pid_dir.name}: the process has exited") from exc

    def close(self) -> None:
        os.close(self.ns_fd)

    def state(self, node: DeviceNode) -> NodeState:
        return NodeState(self._in_child("state", node))

    def ensure(self, node: DeviceNode) -> bool:
        return bool(self._in_child("ensure", node))

    def remove(self, node: DeviceNode) -> bool:
        return bool(self._in_child("remove", node))

    def _in_child(self, op: str, node: DeviceNode) -> str | bool:
        """One operation in a forked child (hotmount/forked.py: other fds closed, a
        deadline, a kill)."""
        reply = forked.run(
            lambda: _child(self.ns_fd, op, node),
            f"{op} of {node.path} in the container's mount namespace",
            keep=(self.ns_fd,),
        )
        if "error" in reply:
            kind = {"UnsafePath": UnsafePath, "ContainerNotFound": ContainerNotFound}
            raise kind.get(reply["error"], KernelError)(reply["message"])
        return reply["result"]


def _child(ns_fd: int, op: str, node: DeviceNode) -> dict[str, str | bool]:  # pragma: no cover
    try:
        if _libc.setns(ns_fd, CLONE_NEWNS) != 0:
            err = ctypes.get_errno()
            raise KernelError(f"setns into the container's mount namespace: {os.strerror(err)}")
        # /proc here is the container's, of another PID namespace: /proc/self/fd is not
        # ours, so no chmod through it. This child is single-threaded: umask 0 is safe.
        os.umask(0)
        parent, name = _split(node.path)
        if op == "state":
            try:
                dirfd = os.open(parent, os.O_PATH | os.O_DIRECTORY)
            except FileNotFoundError:
                result: str | bool = NodeState.ABSENT.value
            else:
                result = classify(_lstat_at(dirfd, name), node).value
        else:
            if op == "ensure":
                os.makedirs(parent, DIR_MODE, exist_ok=True)
            try:
                dirfd = os.open(parent, os.O_PATH | os.O_DIRECTORY)
            except FileNotFoundError:
                dirfd = -1
            if dirfd < 0:
                result = False
            elif op == "ensure":
                result = _make_node(dirfd, name, node)
            else:
                result = _remove_node(dirfd, name, node)
        reply: dict[str, str | bool] = {"result": result}
    except (UnsafePath, KernelError) as exc:
        reply = {"error": type(exc).__name__, "message": exc.message}
    except OSError as exc:
        reply = {"error": "KernelError", "message": f"{node.path}: {exc.strerror}"}
    return reply


def open_container_fs(proc_pid_dir: Path | str, method: str = "auto") -> ContainerFs:
    """`auto` takes openat2 where the kernel has it; `openat2`/`setns` force one."""
    if method == "setns" or (method == "auto" and not openat2_available()):
        return SetnsFs(Path(proc_pid_dir))
    return Openat2Fs(proc_pid_dir)
