"""Choose the PID the next process gets, to attack code that trusts PID order or identity.

`/proc/sys/kernel/ns_last_pid` (root) sets the last PID handed out in our PID
namespace, so the next fork gets the one after it unless another process on the node
forks first: hence retries, and the flock CRIU also takes around its own writes.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

NS_LAST_PID = Path("/proc/sys/kernel/ns_last_pid")


@contextlib.contextmanager
def next_pid_after(last: int) -> Iterator[None]:
    """Within the block, the next process created on the host gets PID `last + 1` (or the
    first free one above it), unless someone else forks first."""
    fd = os.open(NS_LAST_PID, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.write(fd, str(last).encode())
        yield
    finally:
        os.close(fd)


def spawn_with_pid(pid: int, argv: list[str], attempts: int = 500) -> subprocess.Popen[bytes]:
    """Start `argv` as PID `pid` (which must be free), retrying when another fork wins."""
    for _ in range(attempts):
        with next_pid_after(pid - 1):
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL)
        if proc.pid == pid:
            return proc
        proc.kill()
        proc.wait()
    raise RuntimeError(f"could not get PID {pid} in {attempts} attempts")


def pid_exists(pid: int) -> bool:
    return Path(f"/proc/{pid}").exists()
