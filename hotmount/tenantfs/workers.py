"""Bounded children kept for the next call: hotmount/tenantfs/forked.py's guarantees without a
fork per call.

Forking the agent costs milliseconds (its page tables are copied) and slows whatever
it runs next (every page it writes after a fork is copied once more). A scan that
must not hang the agent (hotmount/tenantfs/openfiles.py) runs on every unmount, so its child
is kept: a worker forked once reads (function, arguments) requests from a pipe and
answers each, and the caller keeps every guarantee of `forked.run`:

- the worker closes every inherited pipe and file at its start (`forked`'s rule), so
  it holds no other call's pipe nor a ledger lock; it runs only module-level functions
  given picklable arguments (no fds: it has none of the caller's);
- each call has a deadline: past it the worker is killed through its pidfd and reaped,
  and the call fails with `ChildTimeout`; a worker that dies answers `KernelError`;
- one worker serves one call at a time (a busy pool forks another), and an idle one
  ends itself after `IDLE_SECONDS` (its memory is a copy of the agent's at its fork).
"""

from __future__ import annotations

import os
import pickle
import select
import struct
import threading
import time
import warnings
from collections.abc import Callable
from typing import Any, TypeVar

from hotmount.errors import ChildTimeout, KernelError
from hotmount.tenantfs import forked

T = TypeVar("T")

IDLE_SECONDS = 60.0  # a worker with no request for this long exits
_REUSE_SECONDS = IDLE_SECONDS / 2  # never handed out near its own exit
_IDLE_KEPT = 4  # at most this many idle workers wait for the next call
_HEADER = struct.Struct("!Q")


class _Worker:
    """The caller's side of one worker: its pid, a pidfd, the two pipe ends."""

    def __init__(self) -> None:
        request_read, self.requests = os.pipe()
        self.replies, reply_write = os.pipe()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # the child runs only `_serve`
            pid = os.fork()
        if pid == 0:  # pragma: no cover - runs in the child
            _serve(request_read, reply_write)
        os.close(request_read)
        os.close(reply_write)
        self.pid = pid
        self.pidfd = os.pidfd_open(pid)
        self.used_at = time.monotonic()

    def ask(self, request: bytes, deadline: float) -> bytes | None:
        """The framed answer, b"" if the worker died, None past `deadline`."""
        try:
            forked.write_all(self.requests, request)
        except BrokenPipeError:
            return b""
        header = _read_exactly(self.replies, _HEADER.size, deadline)
        if not header:
            return header
        return _read_exactly(self.replies, _HEADER.unpack(header)[0], deadline)

    def end(self) -> None:
        """Kill and reap it (idle, or past its deadline): a worker is never waited for."""
        os.close(self.requests)
        os.close(self.replies)
        forked.kill(self.pidfd, self.pid)
        os.close(self.pidfd)


class WorkerPool:
    """Idle workers, taken one per call (a new one when none is idle)."""

    def __init__(self) -> None:
        self._idle: list[_Worker] = []
        self._lock = threading.Lock()

    def call(
        self, function: Callable[..., T], args: tuple[Any, ...], what: str,
        deadline: float | None = None,
    ) -> T:  # fmt: skip
        """`function(*args)` in a worker: its result, or the exception it raised.
        `function` must be a module-level function, `args` picklable. Past `deadline`
        seconds (default: forked.DEFAULT_DEADLINE) the worker is killed, `ChildTimeout`."""
        if forked.in_child():  # already bounded by the outer call's deadline
            return function(*args)
        seconds = forked.DEFAULT_DEADLINE if deadline is None else deadline
        body = pickle.dumps((function, args))
        request = _HEADER.pack(len(body)) + body
        worker = self._take()
        try:
            answer = worker.ask(request, time.monotonic() + seconds)
        except BaseException:
            worker.end()
            raise
        finally:
            forked.mark_finished()
        if answer is None:
            worker.end()
            raise ChildTimeout(f"{what} did not finish within {seconds:g}s; stopped it")
        if not answer:
            worker.end()
            raise KernelError(f"{what}: the child died without an answer")
        self._give_back(worker)
        return forked.decode_reply(_HEADER.pack(len(answer)) + answer, what)

    def _take(self) -> _Worker:
        now = time.monotonic()
        stale = []
        with self._lock:
            while self._idle:
                worker = self._idle.pop()
                if now - worker.used_at < _REUSE_SECONDS:
                    break
                stale.append(worker)
            else:
                worker = None
        for old in stale:
            old.end()  # it may have exited by itself already
        return worker if worker is not None else _Worker()

    def _give_back(self, worker: _Worker) -> None:
        worker.used_at = time.monotonic()
        with self._lock:
            if len(self._idle) < _IDLE_KEPT:
                self._idle.append(worker)
                return
        worker.end()

    def close(self) -> None:
        """End every idle worker (tests; a worker in use ends with its call)."""
        with self._lock:
            idle, self._idle = self._idle, []
        for worker in idle:
            worker.end()


POOL = WorkerPool()


def call(
    function: Callable[..., T], args: tuple[Any, ...], what: str, deadline: float | None = None
) -> T:
    """`POOL.call`: the process's shared pool."""
    return POOL.call(function, args, what, deadline)


def _serve(requests: int, replies: int) -> None:  # pragma: no cover - runs in the child
    forked.become_child()
    code = 1
    try:
        forked.close_all_but({0, 1, 2, requests, replies})
        poller = select.poll()
        poller.register(requests, select.POLLIN)
        while poller.poll(IDLE_SECONDS * 1000):
            header = _read_exactly(requests, _HEADER.size, None)
            if not header:
                break  # EOF: the caller let this worker go, or is gone
            body = _read_exactly(requests, _HEADER.unpack(header)[0], None)
            function, args = pickle.loads(body or b"")  # our own caller wrote it
            try:
                reply: tuple[str, object] = ("ok", function(*args))
            except BaseException as exc:  # every failure goes back to the caller
                reply = ("err", exc)
            forked.write_all(replies, forked.encode_reply(reply))
        code = 0
    finally:
        os._exit(code)


def _read_exactly(fd: int, size: int, deadline: float | None) -> bytes | None:
    """`size` bytes; b"" at EOF first, None past `deadline` (None: no deadline)."""
    chunks: list[bytes] = []
    left = size
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    while left:
        if deadline is not None:
            wait = deadline - time.monotonic()
            if wait <= 0:
                return None
            if not poller.poll(wait * 1000):
                continue
        chunk = os.read(fd, left)
        if not chunk:
            return b""
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)
