"""From a container ID or a PID to the container's PIDs, cgroups and mount namespace.

The cgroup is read from `/proc/<pid>/cgroup`, never rebuilt from the pod UID and
QoS class: rebuilt paths are what broke earlier tools on containerd and the
systemd driver. Finding a container by ID walks the cgroup tree (bounded, and
cached) instead of scanning every process on the node; a `/proc` scan is only
the fallback.
"""

from __future__ import annotations

import functools
import os
import re
from collections import deque
from dataclasses import dataclass
from pathlib import Path

from hotmount.cgroups.detect import CgroupLayout
from hotmount.errors import ContainerNotFound, InvalidContainerRef, NotInContainer
from hotmount.hostfs import HostRoot
from hotmount.tenantfs import procfs

_RUNTIME_PREFIXES = ("containerd://", "cri-o://", "docker://")
_HEX64 = re.compile(r"^[0-9a-f]{64}\Z")
_PID = re.compile(r"[0-9]{1,7}")  # ASCII only: str.isdigit() also accepts '²' and '٣'
# The last cgroup path component of a container, in every layout we know of:
#   <id> (cgroupfs: containerd, dockershim, docker), cri-containerd-<id>.scope,
#   crio-<id>.scope / crio-<id>, docker-<id>.scope, libpod-<id>.scope.
_COMPONENT = re.compile(r"^(?:(?:cri-containerd|crio|docker|libpod)-)?([0-9a-f]{64})(?:\.scope)?\Z")
MAX_WALK_DEPTH = 8


@dataclass(frozen=True)
class ContainerRef:
    container_id: str | None = None
    pid: int | None = None

    def __str__(self) -> str:
        return f"pid:{self.pid}" if self.pid is not None else str(self.container_id)


def parse_container_ref(text: str) -> ContainerRef:
    """`<64 hex>`, `containerd://<id>`, `cri-o://<id>`, `docker://<id>` or `pid:<N>`."""
    text = text.strip()
    if text.startswith("pid:"):
        number = text[4:]
        if not _PID.fullmatch(number) or not 0 < int(number) < 1 << 22:
            raise InvalidContainerRef(f"{text!r}: a PID is a positive number, as in pid:4242")
        return ContainerRef(pid=int(number))
    for prefix in _RUNTIME_PREFIXES:
        if text.startswith(prefix):
            text = text[len(prefix) :]
            break
    if not _HEX64.match(text):
        raise InvalidContainerRef(
            f"{text!r} is not a container ID: 64 hex digits, optionally with a "
            "containerd://, cri-o:// or docker:// prefix, or pid:N"
        )
    return ContainerRef(container_id=text)


def container_id_from_path(cgroup_path: str) -> str | None:
    """The container ID a cgroup path names, if any (CRI-O's nested `/container` too)."""
    parts = [p for p in cgroup_path.split("/") if p]
    if parts and parts[-1] == "container":
        parts.pop()
    if not parts or parts[-1].startswith("crio-conmon-"):
        return None
    match = _COMPONENT.match(parts[-1])
    return match.group(1) if match else None


@dataclass(frozen=True)
class CgroupPaths:
    """A process's cgroups as `/proc/<pid>/cgroup` names them (relative to each root)."""

    v1_devices: str | None
    v2: str | None


@functools.lru_cache(maxsize=4096)
def parse_proc_cgroup(text: str) -> CgroupPaths:
    """Pure, so cached by text: a container's processes list the same cgroups."""
    v1_devices = v2 = None
    for line in text.splitlines():
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hierarchy == "0" and controllers == "":
            v2 = path
        elif "devices" in controllers.split(","):
            v1_devices = path
    return CgroupPaths(v1_devices, v2)


@dataclass(frozen=True)
class Container:
    """A running container as the engine sees it from the host."""

    id: str | None
    init_pid: int
    cgroups: CgroupPaths
    v1_devices_dir: Path | None
    v2_dir: Path | None
    procs_dir: Path

    @property
    def key(self) -> str:
        """The ledger key: the container ID, or `pid-<init>` for bare processes."""
        return self.id or f"pid-{self.init_pid}"

    def pids(self) -> list[int]:
        """Every process in the container's cgroup and below, read live."""
        return read_cgroup_pids(self.procs_dir)

    def owns(self, proc_cgroup: bytes) -> bool:
        """Whether a process whose /proc/PID/cgroup reads `proc_cgroup` is in the cgroups
        this container was resolved in (hotmount/tenantfs/procfs.py pins by it)."""
        return parse_proc_cgroup(proc_cgroup.decode()) == self.cgroups

    def as_dict(self) -> dict[str, object]:
        return {
            "id": self.id,
            "initPid": self.init_pid,
            "cgroupV1Devices": self.cgroups.v1_devices,
            "cgroupV2": self.cgroups.v2,
        }


def read_pids_file(path: str) -> list[int] | None:
    """The PIDs one `cgroup.procs` lists (os-level: this is on every mount's path)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        chunks = []
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
    except OSError:
        return None
    finally:
        os.close(fd)
    return [int(x) for x in b"".join(chunks).split()]


def read_cgroup_pids(directory: Path | str) -> list[int]:
    """PIDs in a cgroup and its descendants (containers rarely have any).

    A directory whose link count is 2 has no subdirectories (cgroupfs, like tmpfs and
    ext4, counts them in st_nlink), so its listing is skipped; any other count (btrfs
    always says 1) lists it.
    """
    pids: set[int] = set()
    pending = [os.fspath(directory)]
    while pending:
        current = pending.pop()
        found = read_pids_file(f"{current}/cgroup.procs")
        if found is None:
            continue
        pids.update(found)
        try:
            if os.stat(current).st_nlink == 2:
                continue
            entries = os.scandir(current)
        except OSError:
            continue
        with entries:
            pending.extend(e.path for e in entries if e.is_dir(follow_symlinks=False))
    return sorted(pids)


class ContainerResolver:
    """Resolves references to `Container`s; caches where each container ID lives."""

    def __init__(self, host: HostRoot, layout: CgroupLayout) -> None:
        self.host = host
        self.layout = layout
        self._where: dict[str, Path] = {}
        self._host_ns: str | None = None
        self._init: dict[Path, int] = {}
        self._resolved: dict[str, tuple[Container, int]] = {}

    # -- the resolution cache: a hint keyed by container ID, proven by whoever uses it
    def cached(self, container_id: str) -> tuple[Container, int] | None:
        """A container resolved before, with its init's start time (the cache's key is
        the container ID; its proof is (init PID, start time) plus cgroup membership,
        which the engine checks under a pidfd before it trusts the entry)."""
        return self._resolved.get(container_id)

    def remember(self, container: Container, start_time: int) -> None:
        if container.id is None:
            return
        if len(self._resolved) > 4096:
            self._resolved.clear()
        self._resolved[container.id] = (container, start_time)

    def forget(self, container_id: str) -> None:
        self._resolved.pop(container_id, None)

    def resolve(self, ref: str | ContainerRef) -> Container:
        if isinstance(ref, str):
            ref = parse_container_ref(ref)
        if ref.pid is not None:
            return self._from_pid(ref.pid, expected_id=None)
        assert ref.container_id is not None
        *others, last = self._pids_of(ref.container_id)
        # Any one of the container's processes leads to it, but one may exit while it is
        # read (an exec probe, `kubectl exec`): that is no reason to call the container gone.
        for pid in others:
            try:
                return self._from_pid(pid, expected_id=ref.container_id)
            except ContainerNotFound:
                continue
        return self._from_pid(last, expected_id=ref.container_id)

    def _pids_of(self, container_id: str) -> list[int]:
        cached = self._where.get(container_id)
        if cached is not None and (pids := _pids_or_none(cached)):
            return pids
        self._where.pop(container_id, None)
        for root in (self.layout.v1_devices_root, self.layout.v2_root):
            if root is None:
                continue
            found = find_cgroup_dir(root, container_id)
            if found is not None and (pids := _pids_or_none(found)):
                self._where[container_id] = found
                return pids
        pid = self._scan_proc(container_id)
        if pid is None:
            raise ContainerNotFound(f"container {container_id} is not running on this node")
        return [pid]

    def _scan_proc(self, container_id: str) -> int | None:
        """Fallback for layouts the walk does not reach: one pass over /proc."""
        for pid in procfs.pids(self.host.proc):
            try:
                text = procfs.read_text(self.host.proc, pid, "cgroup")
            except OSError:
                continue
            paths = parse_proc_cgroup(text)
            for path in (paths.v2, paths.v1_devices):
                if path and container_id_from_path(path) == container_id:
                    return pid
        return None

    def _from_pid(self, pid: int, expected_id: str | None) -> Container:
        if pid == 1:
            raise NotInContainer("PID 1 is the host's init, not a container")
        try:
            paths = parse_proc_cgroup(procfs.read_text(self.host.proc, pid, "cgroup"))
            mnt_ns = procfs.namespace(self.host.proc, pid, "mnt")
        except FileNotFoundError as exc:
            what = f"container {expected_id}" if expected_id else f"process {pid}"
            raise ContainerNotFound(f"{what} is not running") from exc
        if mnt_ns == self._host_mnt_ns():
            raise NotInContainer(f"process {pid} runs in the host's mount namespace")
        v1_dir = self.layout.v1_dir(paths.v1_devices)
        v2_dir = self.layout.v2_dir(paths.v2)
        candidates = [
            (path, directory)
            for path, directory in ((paths.v2, v2_dir), (paths.v1_devices, v1_dir))
            if path and path.strip("/") and directory is not None and directory.is_dir()
        ]
        if any(p.startswith("/..") for p, _ in candidates):
            raise NotInContainer(
                f"process {pid}'s cgroup is outside this agent's cgroup namespace; "
                "run the agent in the host cgroup namespace"
            )
        if not candidates:
            raise NotInContainer(f"process {pid} is not in a container's cgroup")
        # The deepest cgroup holds exactly the container's processes.
        cgroup_path, procs_dir = max(candidates, key=lambda c: c[0].count("/"))
        container_id = expected_id or container_id_from_path(cgroup_path)
        pids = read_cgroup_pids(procs_dir)
        if pid not in pids:
            raise ContainerNotFound(f"process {pid} left its container while being resolved")
        cached = self._init.get(procs_dir)
        init = cached if cached in pids else _init_pid(self.host, pids)
        if len(self._init) > 4096:
            self._init.clear()
        self._init[procs_dir] = init
        return Container(
            id=container_id,
            init_pid=init,
            cgroups=paths,
            v1_devices_dir=v1_dir,
            v2_dir=v2_dir,
            procs_dir=procs_dir,
        )

    def host_mnt_ns(self) -> str:
        return self._host_mnt_ns()

    def _host_mnt_ns(self) -> str:
        """The host's mount namespace: PID 1's, or ours where PID 1's is hidden from us."""
        if self._host_ns is None:
            try:
                self._host_ns = procfs.namespace(self.host.proc, 1, "mnt")
            except PermissionError:
                self._host_ns = procfs.namespace("/proc", "self", "mnt")
        return self._host_ns


def _pids_or_none(directory: Path) -> list[int] | None:
    return sorted(read_pids_file(os.path.join(directory, "cgroup.procs")) or ()) or None


def find_cgroup_dir(root: Path, container_id: str) -> Path | None:
    """Breadth-first search for the container's cgroup directory, depth-bounded."""
    queue: deque[tuple[Path, int]] = deque([(root, 0)])
    while queue:
        directory, depth = queue.popleft()
        try:
            entries = list(os.scandir(directory))
        except OSError:
            continue
        for entry in entries:
            if not entry.is_dir(follow_symlinks=False):
                continue
            if container_id in entry.name and container_id_from_path(entry.name) == container_id:
                nested = Path(entry.path, "container")
                return nested if (nested / "cgroup.procs").exists() else Path(entry.path)
            if depth + 1 < MAX_WALK_DEPTH:
                queue.append((Path(entry.path), depth + 1))
    return None


def _init_pid(host: HostRoot, pids: list[int]) -> int:
    """The container's first process.

    Only processes of the container's own PID namespace count: the shallowest among its
    members (fewest `NSpid` levels). A process in a PID namespace nested inside the
    container (`unshare -Urpf` in a pod without a seccomp profile) is PID 1 of *its*
    namespace, but one level deeper, so it never passes for the init.

    Among those, in its own PID namespace the init is the process whose innermost PID is
    1. In a shared one (`shareProcessNamespace`: PID 1 is the pod's pause process, in
    another cgroup) it is the cgroup's oldest process by start time: everything else in
    the cgroup is its descendant or an exec'd session (`kubectl exec`, probes), and
    started later. Not the lowest PID: PIDs wrap (pid_max is 32768 on many nodes), so a
    later exec can get a lower one. Not "the process whose parent is outside the cgroup"
    either: an exec'd process's parent (runc, the shim) is outside too. Start times tie
    only within one clock tick; a tie goes to a process whose parent is outside, then
    the lower PID.
    """
    best: tuple[int, bool, int, bool, int] | None = None
    members = set(pids)
    for pid in pids:
        try:
            status = procfs.read_text(host.proc, pid, "status")
            stat_fields = procfs.read_text(host.proc, pid, "stat").rpartition(")")[2].split()
        except OSError:
            continue  # exited meanwhile
        nspid = next(
            (line.split()[1:] for line in status.splitlines() if line.startswith("NSpid:")), []
        )
        # stat after the command: state ppid ... starttime is field 22 (index 19 here).
        parent, started = int(stat_fields[1]), int(stat_fields[19])
        candidate = (len(nspid), nspid[-1:] != ["1"], started, parent in members, pid)
        if best is None or candidate < best:
            best = candidate
    return best[-1] if best is not None else pids[0]
