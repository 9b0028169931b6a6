"""The node's turn for holder-making mounts, and the clean-up a turn leaves behind.

One holder-making mount at a time on this node: a pin's blockers take every free GPU
for a moment, and a count holder or another pin made meanwhile would find none. A turn
lasts until the kubelet has admitted the pin, not until any pod runs.

What a turn has left to do once its caller has the books it needs (the blockers of a
pin the kubelet has already given its GPU: deleting them is two to eight API calls,
40 to 260 ms on a loaded node) runs on a thread of its own, so that the mount goes on
and answers meanwhile. The next turn starts only after that clean-up has finished, so it
finds the node's GPUs as free as it would have had the clean-up run inside the turn
before it.
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
        self._left: list[threading.Thread] = []
        self._left_guard = threading.Lock()

    @contextmanager
    def turn(self) -> Iterator[None]:
        with self._lock:
            self.finish_left()
            yield

    def leave(self, what: str, work: Callable[[], object]) -> None:
        """Run `work` now, beside the caller, and before the next turn begins. Its failure
        is logged (what it leaves, reconcile collects)."""
        thread = threading.Thread(
            target=_logged, args=(what, work), name=f"hotmount {what}", daemon=True
        )
        with self._left_guard:
            self._left = [t for t in self._left if t.is_alive()]
            self._left.append(thread)
        thread.start()

    def finish_left(self) -> None:
        """Until the clean-up left by earlier turns has finished (bounded by
        `wait_limit`)."""
        with self._left_guard:
            left, self._left = self._left, []
        for thread in left:
            thread.join(self.wait_limit)
            if thread.is_alive():
                log.warning("%s has not finished; this turn goes on", thread.name)


def _logged(what: str, work: Callable[[], object]) -> None:
    try:
        work()
    except Exception:
        log.exception("%s failed", what)
