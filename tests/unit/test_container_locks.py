"""Per-container locks (agent/node/locks.py): one container's operations run one at a
time, and a container's lock goes with its last user instead of staying for ever."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterator

import pytest

from agent.node.locks import ContainerLocks


@pytest.fixture
def fast_switching() -> Iterator[None]:
    """Threads switch every microsecond: a lost race shows up within a few rounds."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        yield
    finally:
        sys.setswitchinterval(before)


def test_a_lock_goes_with_its_last_user() -> None:
    locks = ContainerLocks()
    with locks.hold("gone-1"):
        assert len(locks) == 1
        with locks.hold("other"):
            assert len(locks) == 2
        assert len(locks) == 1
    with pytest.raises(RuntimeError), locks.hold("gone-2"):
        raise RuntimeError("the operation failed")
    assert len(locks) == 0


def test_one_container_one_holder_while_locks_come_and_go(fast_switching: None) -> None:
    """Many callers on few containers: each container's lock is made and dropped over
    and over, and a caller that waited on a lock about to be dropped must still exclude
    the caller that comes next (one lock object per container at any time)."""
    locks = ContainerLocks()
    inside = {key: 0 for key in ("a", "b")}
    overlaps: list[str] = []
    start = threading.Barrier(8)

    def worker(key: str) -> None:
        start.wait()
        for _ in range(300):
            with locks.hold(key):
                inside[key] += 1
                if inside[key] != 1:
                    overlaps.append(key)
                time.sleep(0)  # let the others run while this one holds it
                inside[key] -= 1

    threads = [threading.Thread(target=worker, args=("ab"[i % 2],)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "a caller hung"
    assert overlaps == []
    assert len(locks) == 0
