"""Stopping processes: the one module that sends a signal, and only through a pidfd.

A PID is no identity: a process that exits between a look and a signal hands its
number to whoever the kernel gives it next, anywhere on the node. A pidfd names one
process for as long as it is open, and a signal through it reaches that process or,
once it has exited, nobody (tests/unit/test_one_door.py holds every other module to
this: no os.kill, killpg or signal sent by PID anywhere else).
"""

from __future__ import annotations

import contextlib
import select
import signal
import time


def send(pidfd: int, signum: int) -> bool:
    """`signum` to the pidfd's process; False where it has exited already."""
    try:
        signal.pidfd_send_signal(pidfd, signum)
    except ProcessLookupError:
        return False
    return True


def kill(pidfd: int) -> None:
    """SIGKILL, whether or not the process is still there."""
    with contextlib.suppress(ProcessLookupError):
        signal.pidfd_send_signal(pidfd, signal.SIGKILL)


def wait_exits(pidfds: dict[int, int], timeout: float) -> list[int]:
    """Wait until the processes (PID -> pidfd) exit; the PIDs still alive at the deadline."""
    poller = select.poll()
    by_fd = {fd: pid for pid, fd in pidfds.items()}
    for fd in by_fd:
        poller.register(fd, select.POLLIN)
    alive = set(by_fd)
    deadline = time.monotonic() + timeout
    while alive:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        for fd, _event in poller.poll(left * 1000):
            alive.discard(fd)
            poller.unregister(fd)
    return sorted(by_fd[fd] for fd in alive)


def stop(pidfds: dict[int, int], grace: float) -> list[int]:
    """SIGTERM, up to `grace` seconds, then SIGKILL, to the processes (PID -> pidfd); the
    PIDs signalled (one that exited before is not: whoever holds its number now)."""
    signalled = [pid for pid, fd in pidfds.items() if send(fd, signal.SIGTERM)]
    remaining = wait_exits({pid: pidfds[pid] for pid in signalled}, grace)
    for pid in remaining:
        send(pidfds[pid], signal.SIGKILL)
    wait_exits({pid: pidfds[pid] for pid in remaining}, 5.0)
    return sorted(signalled)
