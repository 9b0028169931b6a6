"""The node's turn for holder-making mounts, and the clean-up a turn leaves behind.

One holder-making mount at a time on this node: a pin's blockers take every free GPU
for a moment, and a count holder or another pin made meanwhile would find none. A turn
lasts until the kubelet has admitted the pin, not until any pod runs.

What a turn has left to do once its caller has the books it needs (the blockers of a
pin the kubelet has already given its GPU: deleting them is two to eight API calls,
40 to 260 ms on a loaded node, and the kubelet then tears their sandboxes down) runs on
a thread of its own, after a short delay, so that the mount goes on and answers first
instead of sharing the API server and the node's CPUs with it. The next turn cuts that
delay short and starts only after the clean-up has finished, so it finds the node's GPUs
as free as it would have had the clean-up run inside the turn before it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

log = logging.getLogger(__name__)


class Turns:
    def __init__(self, wait_limit: float) -> None:
        """`wait_limit`: the longest a turn waits for the clean-up left before it (each
        call it makes is bounded by the API client's own timeout; past the limit the turn
        goes on and merely finds fewer GPUs free)."""
        self.wait_limit = wait_limit
        self._lock = threading.Lock()
        self._left: list[tuple[threading.Thread, threading.Event]] = []
        self._left_guard = threading.Lock()

    @contextmanager
    def turn(self) -> Iterator[None]:
        with self._lock:
            self.finish_left()
            yield

    def leave(self, what: str, work: Callable[[], object], delay: float = 0.0) -> None:
        """Run `work` beside the caller, `delay` seconds from now or as soon as the next
        turn begins, whichever comes first; the next turn waits for it. Its failure is
        logged (what it leaves, reconcile collects)."""
        go = threading.Event()
        thread = threading.Thread(
            target=_later, args=(what, work, go, delay), name=f"hotmount {what}", daemon=True
        )
        with self._left_guard:
            self._left = [(t, g) for t, g in self._left if t.is_alive()]
            self._left.append((thread, go))
        thread.start()

    def finish_left(self) -> None:
        """Until the clean-up left by earlier turns has finished (bounded by
        `wait_limit`)."""
        with self._left_guard:
            left, self._left = self._left, []
        for _, go in left:
            go.set()
        for thread, _ in left:
            thread.join(self.wait_limit)
            if thread.is_alive():
                log.warning("%s has not finished; this turn goes on", thread.name)


def _later(what: str, work: Callable[[], object], go: threading.Event, delay: float) -> None:
    go.wait(delay)
    try:
        work()
    except Exception:
        log.exception("%s failed", what)
