"""The network namespaces an interface moves between, each opened as an fd and proven.

The host's (never the agent's own by guess), a container's (through its init, proven
not reused and not the host's), and the one a record's interface went into (through
any process still in it once the init is gone). Kept apart from hotmount/netdev/moves.py,
which moves and restores interfaces and holds their records, so that how a namespace is
found and proven is read in one place.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import TYPE_CHECKING

from hotmount.errors import ContainerNotFound, KernelError
from hotmount.hostfs import HostRoot
from hotmount.netdev import netlink
from hotmount.netdev.plan import NetdevRecord, NetdevRefused, netns_holder
from hotmount.tenantfs import procfs

if TYPE_CHECKING:
    from pyroute2 import IPRoute


def host_ns_fd(host: HostRoot) -> int:
    """The host's network namespace: its init's (hostPID: the agent's pod need not be
    hostNetwork); where PID 1 refuses (a sandbox's init may be non-dumpable: EACCES
    even to root, on open and readlink alike), kthreadd's (PID 2, a kernel thread:
    kernel threads live in the initial namespace). Never a guess: neither, an error."""
    path = procfs.namespace_path(host.proc, 1, "net")  # for messages
    try:
        return procfs.open_namespace(host.proc, 1, "net")
    except PermissionError:
        pass
    except OSError as exc:
        raise KernelError(f"opening {path}: {exc.strerror}") from exc
    try:
        if not _is_kernel_thread(host, 2):
            raise ValueError("PID 2 is not a kernel thread")
        return procfs.open_namespace(host.proc, 2, "net")
    except (OSError, ValueError, IndexError) as exc:
        raise KernelError(
            f"the host's network namespace cannot be opened ({path}: permission denied; "
            f"kthreadd's: {exc}): run the agent with hostPID and CAP_SYS_PTRACE"
        ) from exc


@contextlib.contextmanager
def host_rtnl(host: HostRoot) -> Iterator[IPRoute]:
    """A netlink socket in the host's network namespace."""
    fd = host_ns_fd(host)
    try:
        with netlink.rtnl(fd) as ipr:
            yield ipr
    finally:
        os.close(fd)


@contextlib.contextmanager
def record_ns(host: HostRoot, record: NetdevRecord) -> Iterator[int]:
    """The namespace the interface went into: through its init while that lives, else
    through any process still in it (a restarted container's sandbox keeps it)."""
    with contextlib.ExitStack() as stack:
        try:
            fd = stack.enter_context(container_ns(host, record.init_pid, record.init_start_time))
        except ContainerNotFound:
            if record.netns_ino is None:
                raise
            fd = stack.enter_context(_holder_ns(host, record))
        yield fd


@contextlib.contextmanager
def _holder_ns(host: HostRoot, record: NetdevRecord) -> Iterator[int]:
    holder = netns_holder(record, _netns_inodes(host))
    if holder is None:
        raise ContainerNotFound(f"the network namespace of {record.container} is gone")
    try:
        fd = procfs.open_namespace(host.proc, holder, "net")
    except OSError as exc:
        raise ContainerNotFound(f"PID {holder} has exited") from exc
    try:
        if os.fstat(fd).st_ino != record.netns_ino:
            raise ContainerNotFound(f"PID {holder} left the namespace of {record.container}")
        yield fd
    finally:
        os.close(fd)


def _netns_inodes(host: HostRoot) -> Iterator[tuple[int, int]]:
    """(PID, netns inode) of every process (read only for records whose init died)."""
    for pid in procfs.pids(host.proc):
        with contextlib.suppress(OSError):
            yield pid, procfs.namespace_inode(host.proc, pid, "net")


@contextlib.contextmanager
def container_ns(host: HostRoot, pid: int, start_time: int) -> Iterator[int]:
    """An fd of the container's network namespace, proven to be its init's (the PID
    not reused since) and not the host's own (a hostNetwork pod)."""
    try:
        fd = procfs.open_namespace(host.proc, pid, "net")
    except (FileNotFoundError, ProcessLookupError) as exc:
        raise ContainerNotFound(f"process {pid} has exited") from exc
    try:
        if _start_time(host, pid) != start_time:
            raise ContainerNotFound(f"PID {pid} is not the container's init any more")
        host_fd = host_ns_fd(host)
        try:
            shared = os.fstat(host_fd).st_ino == os.fstat(fd).st_ino
        finally:
            os.close(host_fd)
        if shared:
            raise NetdevRefused(
                "the container shares the host's network namespace (hostNetwork): "
                "an interface cannot move into it"
            )
        yield fd
    finally:
        os.close(fd)


def _is_kernel_thread(host: HostRoot, pid: int) -> bool:
    flags = int(procfs.read_text(host.proc, pid, "stat").rpartition(")")[2].split()[6])
    return bool(flags & 0x00200000)  # PF_KTHREAD


def _start_time(host: HostRoot, pid: int) -> int:
    try:
        text = procfs.read_text(host.proc, pid, "stat")
    except (FileNotFoundError, ProcessLookupError) as exc:
        raise ContainerNotFound(f"process {pid} has exited") from exc
    return int(text.rpartition(")")[2].split()[19])
