"""Room in a container's memory cgroup: a checkpoint copies each process's GPU memory
into its own host memory, charged to that cgroup. Without room the kernel's OOM killer
would end the very process a suspension is meant to keep.

The room is the least, over the container's memory cgroup and every ancestor with a
limit, of limit minus usage (v1: memory.limit_in_bytes / memory.usage_in_bytes; v2:
memory.max / memory.current); with no limit anywhere, the host's MemAvailable.
"""

from __future__ import annotations

from pathlib import Path

from hotmount.hostfs import HostRoot
from hotmount.tenantfs import procfs

_NO_LIMIT = 1 << 60  # v1 writes "no limit" as a page-rounded LONG_MAX


def memory_cgroup(proc_cgroup: str) -> tuple[str, str] | None:
    """("v1", path) for a v1 memory controller line, else ("v2", path), from the text of
    /proc/PID/cgroup."""
    v2 = None
    for line in proc_cgroup.splitlines():
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if "memory" in controllers.split(","):
            return "v1", path
        if hierarchy == "0" and controllers == "":
            v2 = path
    return ("v2", v2) if v2 is not None else None


def room(host: HostRoot, pid: int) -> int:
    """Bytes the process's memory cgroup (and its ancestors) can still take."""
    text = procfs.read_text(host.proc, pid, "cgroup")
    found = memory_cgroup(text)
    best = _available(host)
    if found is None:
        return best
    mode, relative = found
    if mode == "v1":
        root = host.cgroup_mount / "memory"
        limit_file, usage_file = "memory.limit_in_bytes", "memory.usage_in_bytes"
    else:
        root = host.cgroup_mount / "unified"
        if not root.is_dir() or not (root / "cgroup.controllers").exists():
            root = host.cgroup_mount
        limit_file, usage_file = "memory.max", "memory.current"
    directory = root / relative.lstrip("/")
    while True:
        limit = _read_int(directory / limit_file)
        if limit is not None and limit < _NO_LIMIT:
            usage = _read_int(directory / usage_file) or 0
            best = min(best, max(0, limit - usage))
        if directory == root or root not in directory.parents:
            return best
        directory = directory.parent


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return None if text == "max" else int(text)


def _available(host: HostRoot) -> int:
    for line in host.path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return 0


def mib(size: int) -> str:
    return f"{size / (1 << 20):.0f} MiB"
