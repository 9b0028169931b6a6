"""A tenant's fd flood (issue 40): container processes that hold many dup'd fds.

A tenant floods with `fd = open(path); for _ in range(n): dup(fd)`. The busybox
rootfs has nothing that dups, so the flood is made as `runc exec` would start any
tenant process, with the fds already in place: a host helper opens the file through
`/proc/<init>/root` (the open file is then the container's own file on the container's
own mount, exactly what a tenant's `open` gives), dups it to fds 3..n+2, and execs
`runc exec --preserve-fds n ID sleep`, so a process in the container's namespaces and
cgroup holds them. The container needs an RLIMIT_NOFILE above `n` (RuncContainer's
`nofile`, as a runtime's default hard limit, 524288 or 1048576, lets a real tenant).
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from dataclasses import dataclass, field

from hotmount.host.containers import read_cgroup_pids
from tests.support.runc import RuncContainer
from tests.support.waiting import wait_for

_HELPER = """
import os, sys
path, count, argv = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
fd = os.open(path, os.O_RDONLY)
for n in range(3, count + 3):
    if n != fd:
        os.dup2(fd, n, inheritable=True)
if fd >= count + 3:
    os.close(fd)
os.execvp(argv[0], argv)
"""


def roomiest_nofile() -> int:
    """The largest RLIMIT_NOFILE a container can be given here: 1048576 (a runtime's
    usual hard limit), or this machine's hard limit where that is lower (runc cannot
    raise it without CAP_SYS_RESOURCE)."""
    return min(1 << 20, resource.getrlimit(resource.RLIMIT_NOFILE)[1])


def per_process_limit(container_nofile: int) -> int:
    """How many fds one flooding process can hold in such a container."""
    return container_nofile - 64


@dataclass
class Flood:
    """The flooding processes: their PIDs in the container, and the `runc exec`s."""

    pids: list[int] = field(default_factory=list)
    runs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def end(self) -> None:
        for run in self.runs:
            run.kill()
            run.communicate()


def flood(container: RuncContainer, path: str, count: int, per_process: int) -> Flood:
    """Processes in `container` holding `count` fds in all (`per_process` at most each),
    every one a dup of one open file of the container's `path`."""
    made = Flood()
    try:
        processes = -(-count // per_process)
        for i in range(processes):
            n = count // processes + (1 if i < count % processes else 0)
            before = set(read_cgroup_pids(container.cgroup_dir))
            argv = container.exec_argv("sleep", "100000", exec_options=("--preserve-fds", str(n)))
            target = f"/proc/{container.pid}/root{path}"
            made.runs.append(
                subprocess.Popen(
                    [sys.executable, "-c", _HELPER, target, str(n), *argv],
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    close_fds=True,
                )
            )
            made.pids.append(_new_holder(container, before, n))
    except BaseException:
        made.end()
        raise
    return made


def _new_holder(container: RuncContainer, before: set[int], n: int) -> int:
    """The new container process holding at least `n` fds."""
    found: list[int] = []

    def started() -> bool:
        for pid in set(read_cgroup_pids(container.cgroup_dir)) - before:
            try:
                if len(os.listdir(f"/proc/{pid}/fd")) >= n:
                    found.append(pid)
                    return True
            except OSError:
                continue
        return False

    wait_for(started, f"a process in the container holding {n} fds", timeout=30)
    return found[0]
