"""Long work on one container that the reconcile pass starts and never waits for.

The pass must finish within /healthz's allowance (agent/node/heartbeat.py) and never wait on
a container's lock (agent/common/locks.py). Two of its jobs cannot promise that: an idle
suspension (agent/idle/suspend.py) and the repair of a suspension a crash left
part-way (hotmount/engine/suspension.py `Suspender.repair`) run CUDA lock, checkpoint and
restore calls of up to ten minutes per process (hotmount/suspend/cuda.py), for as many
processes as the tenant started. On the reconcile thread they would put off every
take-back, double booking, remount and orphan cleanup on the node for that long, at
the pace of one tenant's processes, and the heartbeat (which counts a bounded child
only when it returns) would get the agent restarted, and so interrupt the very
suspension it waited for.

So each runs on a thread of its own, holding the container's lock as any operation
does, while the pass goes on and skips that container (`try_hold`). One job per
container at a time: a pass that finds one still running for a container starts none
for it, and looks again the next time. Threads, not a pool: one tenant's slow job never
queues another container's repair behind it, and there are at most as many as
containers with GPUs mounted or suspended.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)


class Background:
    def __init__(self) -> None:
        self._running: set[str] = set()
        self._guard = threading.Lock()

    def start(self, key: str, what: str, work: Callable[[], object]) -> bool:
        """Run `work` on a thread of its own unless a job for container `key` still runs;
        whether it was started. Its failure is logged (the next pass may try again)."""
        with self._guard:
            if key in self._running:
                return False
            self._running.add(key)
        thread = threading.Thread(
            target=self._run, args=(key, what, work), name=f"hotmount {what}", daemon=True
        )
        try:
            thread.start()
        except BaseException:
            self._done(key)
            raise
        return True

    def running(self, key: str) -> bool:
        with self._guard:
            return key in self._running

    def __len__(self) -> int:
        """How many jobs run now."""
        with self._guard:
            return len(self._running)

    def _run(self, key: str, what: str, work: Callable[[], object]) -> None:
        try:
            work()
        except Exception:
            log.exception("%s failed", what)
        finally:
            self._done(key)

    def _done(self, key: str) -> None:
        with self._guard:
            self._running.discard(key)
