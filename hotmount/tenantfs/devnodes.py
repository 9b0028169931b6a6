"""Create and remove device nodes inside a container's mount namespace, safely.

A plain path through `/proc/<pid>/root/...` from the host follows the
container's absolute symlinks against the *host's* root (a container with
`/dev/trap -> /` would have us create nodes in the host's `/`). And below its
`/dev` the tenant may replace a node's directory (`/dev/nvidia-caps`,
`/dev/infiniband`, `/dev/dri`) with a symlink into a volume, or mount a volume
there: a volume whose NFS server it stopped blocks whoever looks into it, for ever.
Node work runs in the agent's own process (no fork per node), so it never looks:

- `Openat2Fs` (kernel 5.6+, no fork): the container root as an O_PATH fd (its init
  pinned: hotmount/tenantfs/procfs.py), `/dev` opened from it with
  `openat2(RESOLVE_IN_ROOT | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS)` (a `/dev`
  that is a symlink is refused: it could point into a volume) and refused
  unless it is the root's own filesystem or a local one (its mount read from procfs,
  hotmount/tenantfs/mounts.py: asking it could hang). Below `/dev` every step is
  `openat2(RESOLVE_BENEATH | RESOLVE_NO_XDEV | RESOLVE_NO_SYMLINKS)` from the verified
  parent's fd, and a missing directory is made with `mkdirat` from that fd: a symlink
  (ELOOP) or another mount (EXDEV) anywhere below `/dev`, the node's own path included,
  is refused (`UnsafePath`), never followed nor entered. Then `mknodat`/`unlinkat`
  relative to the directory's fd.
- `SetnsFs` (fallback): a forked child enters the mount namespace (setns of a
  mount namespace is refused in a multi-threaded process) and works there, bounded
  by a deadline (hotmount/tenantfs/forked.py), with the same refusals at and below
  `/dev` (O_NOFOLLOW and each fd's `mnt_id`, for kernels without openat2).

Modes are set without following the path again: chmod through
`/proc/self/fd/N` of an O_PATH|O_NOFOLLOW fd after `fstat` proved it is the
node we made. An existing path that is not the expected character device is
refused, never overwritten or chmod-ed. Nothing runs from the container image.

`rootdirs.RootDirs` opens directories anywhere in a container's root (symlinks
resolved inside it) for the driver's files (hotmount/driver/place.py: not across a
mount, and only in bounded children); never for device nodes.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import stat
from collections.abc import Callable
from enum import StrEnum
from pathlib import Path
from typing import Protocol, TypedDict

from hotmount.devices.model import DeviceNode
from hotmount.errors import ContainerNotFound, KernelError, UnsafePath
from hotmount.tenantfs import forked, mounts, procfs
from hotmount.tenantfs.resolve import open_at, openat2_available

CLONE_NEWNS = 0x00020000
DIR_MODE = 0o755
# Why /dev alone is opened across a mount: it is the runtime's own (a tmpfs), and its
# filesystem is proven local from procfs before anything below it is looked at.
_DEV_MOUNT = "/dev is the runtime's mount, proven local from procfs before any look below"


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


class Resolved(Protocol):
    """What the door needs of a resolved container (hotmount.host.containers.Container, which
    imports this package: a Protocol keeps the import graph one way)."""

    @property
    def init_pid(self) -> int: ...

    def owns(self, proc_cgroup: bytes) -> bool: ...


class ContainerFs(Protocol):
    def state(self, node: DeviceNode) -> NodeState: ...
    def ensure(self, node: DeviceNode) -> bool: ...
    def remove(self, node: DeviceNode) -> bool: ...
    def close(self) -> None: ...


# The process's own symbols, libc among them: find_library("c") would run ldconfig at import.
_libc = ctypes.CDLL(None, use_errno=True)


# One entry of a directory already verified to be the container's own, as an O_PATH fd:
# never through a symlink (a trailing one is opened itself, or ELOOP where a directory is
# wanted), never into another mount (EXDEV). Two ways: openat2, and a fallback for the
# setns child on kernels without it.
Opener = Callable[[int, str, bool], int]


def open_below(dirfd: int, name: str, directory: bool) -> int:
    """By openat2 beneath `dirfd`, through no symlink and into no other mount
    (`resolve.open_at`'s default): the kernel refuses, and enters nothing."""
    flags = os.O_PATH | os.O_CLOEXEC | (os.O_DIRECTORY if directory else os.O_NOFOLLOW)
    return open_at(dirfd, name, flags)


def nofollow_opener(fdinfo_dir: int) -> Opener:
    """The same without openat2: O_PATH|O_NOFOLLOW opens nothing and follows nothing, and
    the fd's `mnt_id` (its fdinfo, in `fdinfo_dir`) is compared with its parent's before
    anything asks the entry's filesystem (fstat would, on a mount's root)."""

    def open_nofollow(dirfd: int, name: str, directory: bool) -> int:
        fd = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dirfd)
        try:
            if mounts.mnt_id(str(fd), fdinfo_dir) != mounts.mnt_id(str(dirfd), fdinfo_dir):
                raise OSError(errno.EXDEV, os.strerror(errno.EXDEV), name)
            if directory:
                mode = os.fstat(fd).st_mode
                if stat.S_ISLNK(mode):
                    raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), name)
                if not stat.S_ISDIR(mode):
                    raise OSError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), name)
        except BaseException:
            os.close(fd)
            raise
        return fd

    return open_nofollow


def _below_error(path: str, exc: OSError) -> Exception:
    """A refusal below /dev, named by the path the tenant changed."""
    if exc.errno == errno.ELOOP:
        return UnsafePath(
            f"{path} in the container is a symlink; nothing below /dev is followed "
            "through one (a node's directory is the tenant's to replace)"
        )
    if exc.errno == errno.EXDEV:
        return UnsafePath(
            f"{path} in the container is another mount (a volume?); device nodes are "
            "made only on the container's /dev itself, never inside a mount below it"
        )
    if exc.errno == errno.ENOTDIR:
        return UnsafePath(f"{path} in the container is not a directory")
    if exc.errno == errno.ENOENT:  # made a moment ago, or looked at: the tenant removed it
        return UnsafePath(f"{path} in the container vanished meanwhile")
    if exc.errno == errno.ESRCH:
        return ContainerNotFound(f"the container exited while {path} was opened")
    return KernelError(f"opening {path} in the container: {exc.strerror}")


def _subdir(open_: Opener, parent_fd: int, name: str, path: str, create: bool) -> int | None:
    """The directory `name` in the verified directory `parent_fd` (None where absent and
    not `create`); made by mkdirat from that fd first when asked."""
    try:
        return open_(parent_fd, name, True)
    except FileNotFoundError:
        if not create:
            return None
    except OSError as exc:
        raise _below_error(path, exc) from exc
    with contextlib.suppress(FileExistsError):  # made meanwhile: the open checks it
        os.mkdir(name, DIR_MODE, dir_fd=parent_fd)
    try:
        return open_(parent_fd, name, True)
    except OSError as exc:
        raise _below_error(path, exc) from exc


def _lstat_at(open_: Opener, dirfd: int, name: str, path: str) -> os.stat_result | None:
    """What is at `name` (a symlink itself, not its target); a mount there is refused,
    never stat-ed (that would ask the mounted filesystem)."""
    try:
        fd = open_(dirfd, name, False)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise _below_error(path, exc) from exc
    try:
        return os.fstat(fd)
    finally:
        os.close(fd)


def _refuse(path: str, st: os.stat_result, node: DeviceNode) -> UnsafePath:
    return UnsafePath(
        f"{path} in the container is {describe(st)}, not character device "
        f"{node.major}:{node.minor}; refusing to touch it"
    )


def _make_node(open_: Opener, dirfd: int, name: str, node: DeviceNode) -> bool:
    """mknodat + exact mode; False when the expected node was already there."""
    device = os.makedev(node.major, node.minor)
    try:
        os.mknod(name, stat.S_IFCHR | node.file_mode, device, dir_fd=dirfd)
    except FileExistsError:
        st = _lstat_at(open_, dirfd, name, node.path)
        if st is not None and classify(st, node) is NodeState.PRESENT:
            return False
        raise _refuse(node.path, st, node) if st else UnsafePath(f"{node.path} vanished") from None
    try:
        fd = open_(dirfd, name, False)
    except OSError as exc:
        raise _below_error(node.path, exc) from exc
    try:
        st = os.fstat(fd)
        if classify(st, node) is not NodeState.PRESENT:
            raise _refuse(node.path, st, node)
        if stat.S_IMODE(st.st_mode) != node.file_mode:  # the umask took bits away
            os.chmod(f"/proc/self/fd/{fd}", node.file_mode)
    finally:
        os.close(fd)
    return True


def _remove_node(open_: Opener, dirfd: int, name: str, node: DeviceNode) -> bool:
    st = _lstat_at(open_, dirfd, name, node.path)
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
    """Device nodes through openat2 from the container's root fd: no fork, a few µs a node.

    `/dev` is opened once, from the root (the runtime's mount, which an unprivileged
    tenant cannot replace; a symlink there is refused), and refused unless it is the
    root's own filesystem or a local one; below it nothing is followed through a
    symlink nor into another mount. The process is pinned (`procfs.ProcessDir`): its
    root and mount table are the container's, never a reused PID's."""

    def __init__(self, process: procfs.ProcessDir) -> None:
        self._process = process
        self.root_fd = process.open_root()
        self._dirs: dict[str, int] = {}  # /dev and below, opened once per operation
        self._dev_refused: UnsafePath | None = None

    def close(self) -> None:
        for fd in self._dirs.values():
            os.close(fd)
        self._dirs = {}
        os.close(self.root_fd)
        self._process.close()

    def _dir(self, path: str, create: bool) -> int | None:
        """An O_PATH fd of /dev or a directory below it (kept until `close`)."""
        fd = self._dirs.get(path)
        if fd is not None:
            return fd
        if path == "/dev":
            fd = self._dev(create)
        else:
            parent, name = _split(path)
            if not path.startswith("/dev/"):
                raise UnsafePath(f"{path!r} is not under /dev")
            parent_fd = self._dir(parent, create)
            if parent_fd is None:
                return None
            fd = _subdir(open_below, parent_fd, name, path, create)
        if fd is not None:
            self._dirs[path] = fd
        return fd

    def _dev(self, create: bool) -> int | None:
        if self._dev_refused is not None:
            raise self._dev_refused
        flags = os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC
        try:
            fd = open_at(self.root_fd, "dev", flags, in_root=True, cross_mounts=_DEV_MOUNT)
        except FileNotFoundError:
            if not create:
                return None
            raise UnsafePath("the container has no /dev directory") from None
        except NotADirectoryError:
            raise UnsafePath("/dev in the container is not a directory") from None
        except OSError as exc:
            raise _below_error("/dev", exc) from exc
        try:
            refused = self._unless_local(fd)
        except BaseException:
            os.close(fd)
            raise
        if refused is not None:
            os.close(fd)
            self._dev_refused = refused  # once per operation, not once per node
            raise refused
        return fd

    def _unless_local(self, dev_fd: int) -> UnsafePath | None:
        """A refusal unless /dev is a mount of a local filesystem (the runtime's tmpfs, a
        host's devtmpfs) or on the root's own mount: a volume there (a pod may mount one
        at /dev) could hang whoever looks. Read from procfs alone."""
        own = mounts.mnt_id(f"/proc/self/fdinfo/{dev_fd}")
        mount = mounts.mount_of("mountinfo", own, self._process.fd)
        if mount is not None and mount.fstype in mounts.LOCAL_FILESYSTEMS:
            return None
        if own == mounts.mnt_id(f"/proc/self/fdinfo/{self.root_fd}"):
            return None  # no mount of its own: the root's filesystem, the runtime's choice
        what = f"a {mount.fstype} mount" if mount is not None else "a mount it does not list"
        return UnsafePath(
            f"the container's /dev is {what} (a volume?), not a local filesystem; device "
            "nodes are made only where looking cannot hang"
        )

    def state(self, node: DeviceNode) -> NodeState:
        parent, name = _split(node.path)
        dirfd = self._dir(parent, create=False)
        if dirfd is None:
            return NodeState.ABSENT
        return classify(_lstat_at(open_below, dirfd, name, node.path), node)

    def ensure(self, node: DeviceNode) -> bool:
        parent, name = _split(node.path)
        dirfd = self._dir(parent, create=True)
        assert dirfd is not None
        return _make_node(open_below, dirfd, name, node)

    def remove(self, node: DeviceNode) -> bool:
        parent, name = _split(node.path)
        dirfd = self._dir(parent, create=False)
        if dirfd is None:
            return False
        return _remove_node(open_below, dirfd, name, node)


class SetnsFs:
    """Fallback: each operation runs in a forked child inside the mount namespace (~1.6 ms)."""

    def __init__(self, process: procfs.ProcessDir) -> None:
        try:
            self.ns_fd = process.open_namespace("mnt")
        finally:
            process.close()

    def close(self) -> None:
        os.close(self.ns_fd)

    def state(self, node: DeviceNode) -> NodeState:
        return NodeState(str(self._in_child("state", node)))

    def ensure(self, node: DeviceNode) -> bool:
        return bool(self._in_child("ensure", node))

    def remove(self, node: DeviceNode) -> bool:
        return bool(self._in_child("remove", node))

    def _in_child(self, op: str, node: DeviceNode) -> str | bool:
        """One operation in a forked child (hotmount/tenantfs/forked.py: other fds closed, a
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


class _Reply(TypedDict, total=False):
    """What the child sends back: a result, or an error's class name and message."""

    result: str | bool
    error: str
    message: str


def _child(ns_fd: int, op: str, node: DeviceNode) -> _Reply:  # pragma: no cover
    try:
        # Our own fdinfo, opened before setns: the container's /proc is of another PID
        # namespace, where this process has no entry (nor /proc/self/fd to chmod through:
        # this child is single-threaded, so umask 0 is safe instead).
        fdinfo = os.open("/proc/self/fdinfo", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        if _libc.setns(ns_fd, CLONE_NEWNS) != 0:
            err = ctypes.get_errno()
            raise KernelError(f"setns into the container's mount namespace: {os.strerror(err)}")
        os.umask(0)
        open_ = nofollow_opener(fdinfo)
        parent, name = _split(node.path)
        dirfd = _child_dir(open_, parent, create=op == "ensure")
        if op == "state":
            result: str | bool = (
                NodeState.ABSENT.value
                if dirfd is None
                else classify(_lstat_at(open_, dirfd, name, node.path), node).value
            )
        elif dirfd is None:
            result = False
        elif op == "ensure":
            result = _make_node(open_, dirfd, name, node)
        else:
            result = _remove_node(open_, dirfd, name, node)
        reply: _Reply = {"result": result}
    except (UnsafePath, KernelError, ContainerNotFound) as exc:
        reply = {"error": type(exc).__name__, "message": exc.message}
    except OSError as exc:
        reply = {"error": "KernelError", "message": f"{node.path}: {exc.strerror}"}
    return reply


def _child_dir(open_: Opener, path: str, create: bool) -> int | None:  # pragma: no cover
    """/dev as the namespace has it, but never a symlink there (this child is bounded;
    a symlink would lead it elsewhere, as it would `Openat2Fs`), then each directory
    below it the way `Openat2Fs` takes them: no symlink, no other mount."""
    try:
        fd = os.open("/dev", os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        if not create:
            return None
        raise UnsafePath("the container has no /dev directory") from None
    except OSError as exc:  # ENOTDIR, ELOOP: a symlink, or no directory
        if exc.errno == errno.ENOTDIR:
            exc = OSError(errno.ELOOP, os.strerror(errno.ELOOP), "/dev")
        raise _below_error("/dev", exc) from exc
    if stat.S_ISLNK(os.fstat(fd).st_mode):  # O_PATH|O_NOFOLLOW opens a link itself
        os.close(fd)
        raise _below_error("/dev", OSError(errno.ELOOP, os.strerror(errno.ELOOP), "/dev"))
    walked = "/dev"
    for name in path.removeprefix("/dev").split("/")[1:]:
        walked += "/" + name
        below = _subdir(open_, fd, name, walked, create)
        os.close(fd)
        if below is None:
            return None
        fd = below
    return fd


def open_container_fs(
    proc: str | Path,
    container: Resolved,
    method: str = "auto",
    process: procfs.ProcessDir | None = None,
) -> ContainerFs:
    """The container's device nodes through its init, pinned and proven to be in the
    container's cgroups (a PID reused since the container was resolved is refused), or
    through `process`, the init pinned and proven so already (a session's), taken over.
    `auto` takes openat2 where the kernel has it; `openat2`/`setns` force one."""
    if process is None:
        process = procfs.ProcessDir(proc, container.init_pid, container.owns)
    try:
        if method == "setns" or (method == "auto" and not openat2_available()):
            return SetnsFs(process)
        return Openat2Fs(process)
    except BaseException:
        process.close()
        raise
