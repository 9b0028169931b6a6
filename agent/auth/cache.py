"""A small thread-safe cache with a time to live: TokenReview answers and refusals
(agent/auth/authenticate.py) and SubjectAccessReview decisions (agent/auth/authorize.py).

cachetools' TTLCache bounds it (the least recently used go first past `maxsize`, so a
flood of distinct callers cannot grow it); the lock is ours, since TTLCache is not
thread-safe and the agent answers on many threads."""

from __future__ import annotations

import threading
from typing import Any

from cachetools import TTLCache

MAX_ENTRIES = 4096


class TtlCache:
    def __init__(self, ttl: float, maxsize: int = MAX_ENTRIES) -> None:
        self.ttl = ttl
        self._items: TTLCache[Any, Any] = TTLCache(maxsize=maxsize, ttl=max(ttl, 1e-9))
        self._lock = threading.Lock()

    def get(self, key: Any) -> Any:
        """The value put under `key` within the time to live, else None."""
        with self._lock:
            return self._items.get(key)

    def put(self, key: Any, value: Any) -> None:
        with self._lock:
            self._items[key] = value
