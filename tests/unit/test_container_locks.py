"""Per-container locks (agent/common/locks.py): one container's operations run one at a
time, and a container's lock goes with its last user instead of staying for ever."""

from __future__ import annotations

import ast
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.common.locks import ContainerLocks

ROOT = Path(__file__).resolve().parents[2]


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


def test_try_hold_takes_a_free_lock_and_never_waits_for_a_held_one() -> None:
    """Reconcile's way in: a held container is skipped at once, a free one is held for
    the body, and a lock tried and not got goes with its last user all the same."""
    locks = ContainerLocks()
    with locks.try_hold("a") as first:
        assert first
        got: list[bool] = []
        other = threading.Thread(target=lambda: got.append(_try(locks, "a")))
        other.start()
        other.join(timeout=30)
        assert not other.is_alive(), "try_hold waited for a held lock"
        assert got == [False]
        with locks.try_hold("b") as free:
            assert free  # another container's lock is its own
    assert len(locks) == 0
    with locks.hold("a"), pytest.raises(RuntimeError), locks.try_hold("x") as free:
        assert free
        raise RuntimeError("the body failed")
    assert len(locks) == 0
    with locks.try_hold("a") as again:
        assert again  # released by the first user
        assert not _try(locks, "a")  # not re-entrant: the same thread is refused too


def _try(locks: ContainerLocks, key: str) -> bool:
    with locks.try_hold(key) as free:
        return free


def test_try_hold_excludes_hold_and_hold_excludes_try_hold(fast_switching: None) -> None:
    """Routes wait (`hold`), reconcile tries (`try_hold`): one holder at a time either way."""
    locks = ContainerLocks()
    inside = 0
    overlaps = 0
    start = threading.Barrier(4)

    def enter() -> None:
        nonlocal inside, overlaps
        inside += 1
        if inside != 1:
            overlaps += 1
        time.sleep(0)
        inside -= 1

    def waiting() -> None:
        start.wait()
        for _ in range(300):
            with locks.hold("c"):
                enter()

    def trying() -> None:
        start.wait()
        for _ in range(300):
            with locks.try_hold("c") as free:
                if free:
                    enter()

    threads = [threading.Thread(target=f) for f in (waiting, waiting, trying, trying)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "a caller hung"
    assert overlaps == 0
    assert len(locks) == 0


# The code that runs on the reconcile pass (agent/node/reconcile.py and what it calls).
RECONCILE_MODULES = [
    "agent/node/reconcile.py",
    "agent/books/holders.py",
    "agent/books/double_booking.py",
    "agent/idle/reclaim.py",
    "agent/idle/suspend.py",
    "agent/node/remounts.py",
]


@pytest.mark.parametrize("path", RECONCILE_MODULES)
def test_reconcile_code_never_waits_on_a_container_lock(path: str) -> None:
    """A pass that waited on a container's lock would wait as long as the call holding
    it: minutes for a suspension (issue 40). These modules only try it."""
    tree = ast.parse((ROOT / path).read_text())
    waits = [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "hold"
    ]
    assert waits == [], f"{path} waits on a container lock at lines {waits}: use try_hold"
