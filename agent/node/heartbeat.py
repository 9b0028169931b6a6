"""Whether the reconcile loop still makes progress: what /healthz answers.

Reconcile runs on one thread; a pass that never returns (a filesystem wait outside a
bounded child, a lock that is never released) stops idle reclaim, take-backs,
remounts and orphan cleanup while every route still answers. So liveness is the age
of the reconcile thread's last sign of life: a finished pass, or, within a pass, a
bounded child (hotmount/tenantfs/forked.py) that returned or was killed at its deadline. A
pass slowed by tenants' hung filesystems keeps ticking and is not restarted for it
(that would let a tenant restart the agent at will); a pass stuck for good stops
ticking. Before the first pass the age counts from the agent's start.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from hotmount.api import last_finished


class ReconcileHeartbeat:
    def __init__(
        self,
        allowance: float,
        on_success: Callable[[float], None] = lambda _: None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.allowance = allowance
        self._on_success = on_success
        self._clock = clock
        self._last = clock()  # the start: the first pass is measured from here
        self._thread: int | None = None  # the thread of the pass now running

    def started(self) -> None:
        """Called on the thread that runs the pass."""
        self._thread = threading.get_ident()

    def finished(self, ok: bool) -> None:
        """A pass returned (`ok`) or raised: either way the loop is alive."""
        self._thread = None
        self._last = self._clock()
        if ok:
            self._on_success(time.time())

    def stalled(self) -> str | None:
        """Why the loop looks hung, or None while it showed life recently enough."""
        last = self._last
        thread = self._thread
        if thread is not None:
            last = max(last, last_finished(thread) or last)
        age = self._clock() - last
        if age <= self.allowance:
            return None
        return (
            f"the reconcile loop has shown no progress for {age:.0f}s "
            f"(the limit is {self.allowance:g}s: --reconcile-stall-intervals)"
        )
