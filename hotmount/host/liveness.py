"""Is the container still the one we resolved? A pidfd on its init, and one-read
/proc looks (the mount hot path) that turn a gone process into ContainerNotFound.

PIDs are reused: a container resolved a moment ago may have exited and its init's PID
gone to someone else. So every operation holds a pidfd on the init (an exit is seen
mid-operation) and proves the process by its start time, its cgroups and its mount
namespace before anything is written, read through one pinned /proc/PID directory
(`procfs.ProcessDir`) that the operation's device nodes are then opened from.
"""

from __future__ import annotations

from hotmount.errors import ContainerNotFound, NotInContainer
from hotmount.host.containers import (
    CgroupPaths,
    Container,
    ContainerRef,
    ContainerResolver,
    parse_container_ref,
    parse_proc_cgroup,
    read_pids_file,
)
from hotmount.tenantfs import procfs


def enter(
    resolver: ContainerResolver, proc: str, ref: str | ContainerRef | Container
) -> tuple[Container, Liveness]:
    """The container, resolved and pinned by a pidfd (close the `Liveness`).

    A container ID resolved before is taken from the resolver's cache, but only once
    proven under the pidfd: its init has the start time it had when resolved (so the
    PID is not another process's now), is still in the container's cgroup and is not
    in the host's mount namespace. Any doubt drops the entry and resolves afresh.
    """
    if isinstance(ref, Container):
        return ref, Liveness(proc, ref).enter()
    if isinstance(ref, str):
        ref = parse_container_ref(ref)
    hit = resolver.cached(ref.container_id) if ref.container_id else None
    if hit is not None:
        cached, resolved_start = hit
        try:
            proven = Liveness(proc, cached, resolved_start, resolver.host_mnt_ns())
            return cached, proven.enter()
        except (ContainerNotFound, NotInContainer):
            resolver.forget(cached.id or "")
    container = resolver.resolve(ref)
    alive = Liveness(proc, container).enter()
    resolver.remember(container, alive.start_time)
    return container, alive


class Liveness:
    """A pidfd on the container's init: notices an exit mid-operation, and PID reuse.

    `expected_start`: the init's start time when it was resolved (a cached resolution);
    another start time means the PID is another process's now. `host_mnt_ns`: refuse an
    init found in the host's mount namespace (re-checked for a cached resolution).
    """

    def __init__(
        self,
        proc: str,
        container: Container,
        expected_start: int | None = None,
        host_mnt_ns: str | None = None,
    ) -> None:
        self.container = container
        self.proc = proc
        self.expected_start = expected_start
        self.host_mnt_ns = host_mnt_ns

    def enter(self) -> Liveness:
        pid = self.container.init_pid
        try:
            self.process = procfs.ProcessDir(self.proc, pid)
        except ContainerNotFound as exc:
            raise ContainerNotFound(f"container {self.container.key} has exited") from exc
        self.fd = self.process.pidfd
        try:
            self.start_time = start_time_of(self.process.read("stat", 4096))
            if self.expected_start is not None and self.start_time != self.expected_start:
                raise ContainerNotFound(f"PID {pid} is no longer {self.container.key}'s init")
            self.check()
            if self.expected_start is not None:
                # A cached resolution: the same process (start time), and in the very
                # cgroups it was resolved in, so every directory derived from them holds.
                cgroups = parse_proc_cgroup(self.process.read("cgroup", 65536).decode())
                if cgroups != self.container.cgroups:
                    raise ContainerNotFound(f"PID {pid} has left {self.container.key}'s cgroups")
            elif not is_member(self.container):
                # Resolved a moment ago, gone since, its PID now someone else's: the pidfd
                # holds whatever process has that PID, so prove it is still the container's.
                raise ContainerNotFound(f"container {self.container.key} has exited")
            if self.host_mnt_ns is not None and self.process.namespace("mnt") == self.host_mnt_ns:
                raise NotInContainer(f"process {pid} runs in the host's mount namespace")
        except BaseException:
            self.process.close()
            raise
        return self

    def pinned_process(self) -> procfs.ProcessDir:
        """The init's /proc directory as proven here, for the caller to own and close:
        the container's filesystem opened from it needs no second pin nor proof."""
        return self.process.dup()

    def __enter__(self) -> Liveness:
        return self if hasattr(self, "fd") else self.enter()

    def check(self) -> None:
        if procfs.exited(self.fd):
            raise ContainerNotFound(f"container {self.container.key} exited mid-operation")

    def __exit__(self, *exc: object) -> None:
        self.process.close()


def is_member(container: Container) -> bool:
    """The init is in the container's cgroup: its own `cgroup.procs` first (one read),
    the whole subtree only when it is not there."""
    own = read_pids_file(f"{container.procs_dir}/cgroup.procs")
    return (own is not None and container.init_pid in own) or (
        container.init_pid in container.pids()
    )


def read_proc(proc: str, pid: int, name: str, size: int) -> bytes:
    """One read of /proc/PID/`name` (os-level: the mount hot path); a gone process is
    ContainerNotFound, whether it went before the open or during the read."""
    try:
        return procfs.read(proc, pid, name, size)
    except (FileNotFoundError, ProcessLookupError) as exc:
        raise ContainerNotFound(f"process {pid} has exited") from exc


def pid_namespace(proc: str, pid: int) -> str:
    """The process's PID namespace, as `/proc/PID/ns/pid` names it (`pid:[inode]`)."""
    try:
        return procfs.namespace(proc, pid, "pid")
    except (FileNotFoundError, ProcessLookupError) as exc:
        raise ContainerNotFound(f"process {pid} has exited") from exc


def pid_in(proc: str, pid: int, namespace: str) -> int | None:
    """The host process `pid`'s PID in the PID namespace `namespace` (`pid_namespace`'s
    name) when that is its own: the innermost of its `NSpid`. None for a process of any
    other PID namespace, one nested inside it included (named by nothing, rather than
    by a number the namespace's processes would not know it by)."""
    if pid_namespace(proc, pid) != namespace:
        return None
    status = read_proc(proc, pid, "status", 65536)
    line = next((x for x in status.splitlines() if x.startswith(b"NSpid:")), None)
    return int(line.split()[-1]) if line else None


def cgroups_of(proc: str, pid: int) -> CgroupPaths:
    return parse_proc_cgroup(read_proc(proc, pid, "cgroup", 65536).decode())


def mnt_ns(proc: str, pid: int) -> str:
    try:
        return procfs.namespace(proc, pid, "mnt")
    except (FileNotFoundError, ProcessLookupError) as exc:
        raise ContainerNotFound(f"process {pid} has exited") from exc


def start_time(proc: str, pid: int) -> int:
    return start_time_of(read_proc(proc, pid, "stat", 4096))


def start_time_of(stat: bytes) -> int:
    """The start time in a /proc/PID/stat line (field 22, after the command's parentheses)."""
    return int(stat.rpartition(b")")[2].split()[19])
