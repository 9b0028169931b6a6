"""Whether the reconcile loop still finishes passes: what /healthz answers.

Reconcile runs on one thread; a pass that never returns (a hung filesystem, a lock
that is never released) stops idle reclaim, take-backs, remounts and orphan cleanup
while every route still answers. So liveness is the age of the last finished pass:
past `stall_intervals` reconcile intervals /healthz fails and the kubelet restarts the
agent. Until the first pass finishes the age counts from the agent's start, so a
slow first pass (repairs after a restart) has the same allowance and no more.
"""

from __future__ import annotations

import time
from collections.abc import Callable


class ReconcileHeartbeat:
    def __init__(
        self,
        interval: float,
        stall_intervals: float,
        on_success: Callable[[float], None] = lambda _: None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.allowance = interval * stall_intervals
        self._on_success = on_success
        self._clock = clock
        self._last = clock()  # the start: the first pass is measured from here

    def finished(self, ok: bool) -> None:
        """A pass returned (`ok`) or raised: either way the loop is alive."""
        self._last = self._clock()
        if ok:
            self._on_success(time.time())

    def stalled(self) -> str | None:
        """Why the loop looks hung, or None while a pass finished recently enough."""
        age = self._clock() - self._last
        if age <= self.allowance:
            return None
        return (
            f"no reconcile pass has finished for {age:.0f}s "
            f"(the limit is {self.allowance:g}s: --reconcile-stall-intervals)"
        )
