"""Work in a forked child that cannot hang its caller: fds closed, a deadline, a kill.

A tenant's filesystem (an NFS server it stopped, a FUSE server that never answers)
blocks whoever touches it, uninterruptibly for a thread but not for a process: its
waits are killable. So work that may touch a container's files, and every
fork-then-setns step, runs here:

- the child closes every inherited pipe and file except those it is told to keep:
  another call's pipe write end (whose reader would wait for an EOF that never comes
  while this child lives) and the ledger's flock fds (a lock that would outlive its
  holder's release) are not carried along;
- the parent waits for the answer up to a deadline, then SIGKILLs the child through
  a pidfd and reaps it (a child that does not die at once is reaped by a thread), and
  the call fails with `ChildTimeout`.
"""

from __future__ import annotations

import contextlib
import functools
import os
import pickle
import select
import struct
import threading
import time
import traceback
import warnings
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from hotmount.errors import ChildTimeout, HotmountError, KernelError
from hotmount.tenantfs import signals

T = TypeVar("T")

DEFAULT_DEADLINE = 20.0  # seconds; set from the agent's --fs-deadline
_REAP_SECONDS = 2.0
_in_child = False
_finished_at: dict[int, float] = {}  # thread -> when a child of its last came back or died


def last_finished(thread: int) -> float | None:
    """When a child that `thread` ran last finished or was killed (time.monotonic()):
    a thread waiting on bounded children is slow, not stuck (agent/node/heartbeat.py)."""
    return _finished_at.get(thread)


def set_default_deadline(seconds: float) -> None:
    global DEFAULT_DEADLINE
    DEFAULT_DEADLINE = seconds


def in_child() -> bool:
    """True inside a child of `run` (work there is bounded already)."""
    return _in_child


def run(
    work: Callable[[], T], what: str, *, keep: Iterable[int] = (), deadline: float | None = None
) -> T:
    """`work()` in a forked child: its result, or the exception it raised, comes back.

    `keep` are the fds the work needs; every other one is closed in the child first.
    Past `deadline` seconds the child is killed and `ChildTimeout` names `what`."""
    seconds = DEFAULT_DEADLINE if deadline is None else deadline
    read_end, write_end = os.pipe()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # the child runs only `work`
        pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child
        _child(work, write_end, set(keep))
    os.close(write_end)
    try:
        pidfd = os.pidfd_open(pid)
    except BaseException:
        os.close(read_end)
        reap(pid)
        raise
    try:
        data = _read_until(read_end, time.monotonic() + seconds)
        if data is None:
            kill(pidfd, pid)
            raise ChildTimeout(f"{what} did not finish within {seconds:g}s; stopped it")
        reap(pid)
    finally:
        os.close(read_end)
        os.close(pidfd)
        mark_finished()
    return decode_reply(data, what)


def mark_finished() -> None:
    """Note that a bounded child of this thread's came back or was killed (now)."""
    _finished_at[threading.get_ident()] = time.monotonic()


def become_child() -> None:
    """In a newly forked bounded child: bounded work it calls runs in place."""
    global _in_child
    _in_child = True


def _child(work: Callable[[], object], out: int, keep: set[int]) -> None:  # pragma: no cover
    become_child()
    code = 1
    try:
        close_all_but(keep | {0, 1, 2, out})
        try:
            reply: tuple[str, object] = ("ok", work())
        except BaseException as exc:  # every failure goes back to the parent
            reply = ("err", exc)
        write_all(out, encode_reply(reply))
        code = 0
    except BaseException:
        traceback.print_exc()  # to the agent's stderr: the parent says only "died"
    finally:
        os._exit(code)


def encode_reply(reply: tuple[str, object]) -> bytes:
    """("ok", result) or ("err", exception), framed (its length first) for the parent."""
    try:
        body = pickle.dumps(reply)
        pickle.loads(body)  # an exception whose __init__ takes more args fails here
    except Exception:  # not picklable both ways: its text still goes
        text = getattr(reply[1], "message", None) or f"{type(reply[1]).__name__}: {reply[1]}"
        body = pickle.dumps(("err", KernelError(text)))
    return struct.pack("!Q", len(body)) + body


def close_all_but(keep: set[int]) -> None:
    """Close every inherited pipe and file (a path: regular, directory, device, O_PATH)
    but `keep`. Sockets and anonymous inodes (epoll, eventfd) stay: a library's fork
    handler (grpc's) restarts its threads in the child on them, and they carry no EOF
    another call waits for nor a lock."""
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd in keep:
            continue
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue  # the listing's own fd, closed already
        if target.startswith(("pipe:", "/")):
            os.close(fd)


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _read_until(fd: int, deadline: float) -> bytes | None:
    """Everything up to EOF, or None at the deadline. The child alone holds the write end
    (it closed every other fd), so EOF comes when it exits or writes its answer."""
    chunks: list[bytes] = []
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        if not poller.poll(left * 1000):
            continue
        chunk = os.read(fd, 1 << 20)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


def decode_reply(data: bytes, what: str) -> T:  # type: ignore[type-var]
    if len(data) < 8 or len(data) - 8 != struct.unpack("!Q", data[:8])[0]:
        raise KernelError(f"{what}: the child died without an answer")
    kind, value = pickle.loads(data[8:])  # our own child wrote it
    if kind == "ok":
        return value  # type: ignore[no-any-return]
    if isinstance(value, HotmountError | OSError):
        raise value
    raise KernelError(f"{what}: {type(value).__name__}: {value}")


def kill(pidfd: int, pid: int) -> None:
    """SIGKILL our own child through its pidfd (hotmount/tenantfs/signals.py), and reap it."""
    signals.kill(pidfd)
    ready, _, _ = select.select([pidfd], [], [], _REAP_SECONDS)
    if ready:
        reap(pid)
    else:  # not dead yet (a slow killable wait): reap it off this thread
        threading.Thread(target=reap, args=(pid,), name=f"reap-{pid}", daemon=True).start()


def reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)


def bounded(what: str) -> Callable[[Callable[..., T]], Callable[..., T]]:
    """A method that runs through `run`, keeping the fds its object's `fds()` names.

    Called inside such a child already (one bounded method calling another), it runs
    in place: the outer deadline covers it."""

    def wrap(method: Callable[..., T]) -> Callable[..., T]:
        @functools.wraps(method)
        def in_child(self: Any, *args: Any, **kwargs: Any) -> T:
            if _in_child:
                return method(self, *args, **kwargs)
            return run(lambda: method(self, *args, **kwargs), what, keep=self.fds())

        return in_child

    return wrap
