"""hotmount/tenantfs/workers.py on real forked processes: one worker serves many calls, and each
call keeps forked.run's guarantees (answers, errors, no inherited fds, the deadline)."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

import pytest

from hotmount.errors import ChildTimeout, KernelError, UnsafePath
from hotmount.tenantfs import workers


@pytest.fixture
def pool() -> Iterator[workers.WorkerPool]:
    pool = workers.WorkerPool()
    yield pool
    pool.close()


def _refuse(path: str) -> None:
    raise UnsafePath(f"{path} is a symlink")


def _fds() -> dict[int, str]:
    """fd -> what it is, in the worker (the listing's own fd has closed by the readlink)."""
    found = {}
    for name in os.listdir("/proc/self/fd"):
        try:
            found[int(name)] = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue
    return found


def _pid_of_parent() -> int:
    return os.getppid()


def test_answers_and_the_engines_errors_come_back_from_one_reused_worker(
    pool: workers.WorkerPool,
) -> None:
    first = pool.call(os.getpid, (), "work")
    assert first != os.getpid()  # not in the caller's process
    assert pool.call(os.getpid, (), "work") == first  # the same worker: no fork this time
    assert pool.call(_pid_of_parent, (), "work") == os.getpid()
    with pytest.raises(UnsafePath, match="/dev/x is a symlink"):
        pool.call(_refuse, ("/dev/x",), "work")
    assert pool.call(os.getpid, (), "work") == first  # an error does not cost the worker


def test_a_worker_keeps_no_pipe_or_file_of_the_caller(pool: workers.WorkerPool) -> None:
    read_end, write_end = os.pipe()  # another call's pipe: must not live on in the worker
    try:
        seen = pool.call(_fds, (), "look")
        assert not {read_end, write_end} & seen.keys()
        beyond_stdio = [what for fd, what in seen.items() if fd > 2]
        # Its own request and reply pipes; no file (sockets and anonymous inodes may stay)
        assert sum(what.startswith("pipe:") for what in beyond_stdio) == 2
        assert not [what for what in beyond_stdio if what.startswith("/")]
    finally:
        os.close(read_end)
        os.close(write_end)


def test_a_worker_past_its_deadline_is_killed_and_reaped_and_replaced(
    pool: workers.WorkerPool,
) -> None:
    before = pool.call(os.getpid, (), "work")
    with pytest.raises(ChildTimeout, match="the hung step did not finish within 1s"):
        pool.call(time.sleep, (600,), "the hung step", deadline=1)
    with pytest.raises(ChildProcessError):  # gone and reaped: no zombie left
        os.waitpid(before, os.WNOHANG)
    after = pool.call(os.getpid, (), "work")
    assert after != before


def test_a_worker_that_dies_is_a_clear_error_and_the_next_call_works(
    pool: workers.WorkerPool,
) -> None:
    before = pool.call(os.getpid, (), "work")
    with pytest.raises(KernelError, match="the step: the child died without an answer"):
        pool.call(os._exit, (3,), "the step")
    with pytest.raises(ChildProcessError):
        os.waitpid(before, os.WNOHANG)
    assert pool.call(os.getpid, (), "work") not in (before, os.getpid())


def test_an_idle_worker_ends_when_let_go(pool: workers.WorkerPool) -> None:
    pid = pool.call(os.getpid, (), "work")
    pool.close()
    with pytest.raises(ChildProcessError):  # killed and reaped: no zombie left
        os.waitpid(pid, os.WNOHANG)
