"""One lock per container, shared by every use case that changes a container.

Operations on one container run one at a time; operations on different containers run
side by side, and two containers racing for one device meet at the engine's claim (one
wins, the other gets 409).
"""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager


class ContainerLocks:
    def __init__(self) -> None:
        self._locks: dict[str, threading.Lock] = defaultdict(threading.Lock)
        self._guard = threading.Lock()

    @contextmanager
    def hold(self, container_id: str) -> Iterator[None]:
        with self._guard:
            lock = self._locks[container_id]
        with lock:
            yield
