"""One lock per container, shared by every use case that changes a container.

Operations on one container run one at a time; operations on different containers run
side by side, and two containers racing for one device meet at the engine's claim (one
wins, the other gets 409).

Two ways in. A route waits its turn (`hold`): its caller asked for that container and
nothing else. The reconcile pass never waits (`try_hold`): a suspension holds its
container's lock for as long as its CUDA processes take to lock and checkpoint (minutes
for a large process), and a pass that waited on it would stop take-backs, double
bookings, idle reclaim and remounts on the whole node for that long, and fail /healthz
(agent/node/heartbeat.py). A container found busy is skipped for this pass and looked at
again in the next one.

A container's lock lives while someone holds it or waits for it, and goes with the last
of them: a node that sees thousands of containers come and go keeps no lock for those
gone. The count of users is kept under the guard lock, so a caller either finds the lock
object the others hold or wait on, or, when there is none, makes the only one.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager


class _Entry:
    __slots__ = ("lock", "users")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.users = 0  # holders and waiters


class ContainerLocks:
    def __init__(self) -> None:
        self._entries: dict[str, _Entry] = {}
        self._guard = threading.Lock()

    @contextmanager
    def hold(self, container_id: str) -> Iterator[None]:
        """The container's lock, waiting for it as long as another holds it (routes)."""
        entry = self._enter(container_id)
        try:
            with entry.lock:
                yield
        finally:
            self._leave(container_id, entry)

    @contextmanager
    def try_hold(self, container_id: str) -> Iterator[bool]:
        """The container's lock if it is free now: yields True and holds it for the body,
        or yields False at once and holds nothing (reconcile: skip the container)."""
        entry = self._enter(container_id)
        try:
            mine = entry.lock.acquire(blocking=False)
            try:
                yield mine
            finally:
                if mine:
                    entry.lock.release()
        finally:
            self._leave(container_id, entry)

    def _enter(self, container_id: str) -> _Entry:
        with self._guard:
            entry = self._entries.get(container_id)
            if entry is None:
                entry = self._entries[container_id] = _Entry()
            entry.users += 1
        return entry

    def _leave(self, container_id: str, entry: _Entry) -> None:
        with self._guard:
            entry.users -= 1
            if entry.users == 0:
                del self._entries[container_id]

    def __len__(self) -> int:
        """How many containers have a lock now (held or waited for)."""
        with self._guard:
            return len(self._entries)
