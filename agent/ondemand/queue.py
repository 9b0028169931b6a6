"""Who gets the next free GPU of a model when on-demand notebooks wait for one (issue 42).

Pure: no clock and no I/O (times are given), so the rules are tested exactly.

- **Priority first.** A request of a higher priority is served before any of a lower.
- **Fair across namespaces.** Among requests of the same priority, the namespace served
  least recently goes first (one never served, before all); within a namespace, first
  come first served. A namespace with ten waiting cells cannot keep another's one cell
  waiting behind all ten: it is served after at most one of them.
- **Bounded per caller.** One caller (a user, or a pod's own token) holds at most
  `per_caller` places, and the whole queue at most `limit`: a flood is refused at the
  door with a clear reason, never queued.
- **One place per pod.** A pod that asks again while it waits (a retried cell) keeps its
  place: asking twice is not two places.

`order` tells where every waiter stands, as GPUs free one by one; `position` is a cell's
place in that order (the `2nd in line` a notebook shows) and `estimate` what it may wait.
Which GPU goes to whom, and which idle one is suspended for a waiter: planning.py.
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

DEFAULT_PER_CALLER = 2
DEFAULT_LIMIT = 256


@dataclass(frozen=True)
class Request:
    """One pod waiting for a GPU of `model` (`""`: of any model)."""

    ticket: int  # arrival order on this node: lower came first
    namespace: str
    pod: str
    caller: str
    model: str
    since: float
    priority: int = 0


class QueueRefused(Exception):
    """The queue will not take the request (a bound reached); nothing was queued."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


@dataclass
class FairQueue:
    per_caller: int = DEFAULT_PER_CALLER
    limit: int = DEFAULT_LIMIT
    _waiting: dict[int, Request] = field(default_factory=dict)
    _last_served: dict[str, int] = field(default_factory=dict)  # namespace -> serve count
    _serves: int = 0
    _tickets: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    def join(
        self, namespace: str, pod: str, caller: str, model: str, now: float, priority: int = 0
    ) -> Request:
        """Queue the pod for a GPU of `model`, or return its place if it waits already.

        Raises QueueRefused when the caller holds `per_caller` places already, or the
        queue is full."""
        for waiting in self._waiting.values():
            if (waiting.namespace, waiting.pod) == (namespace, pod):
                return waiting
        mine = sum(1 for w in self._waiting.values() if w.caller == caller)
        if mine >= self.per_caller:
            raise QueueRefused(
                f'user "{caller}" already waits for {mine} GPUs on this node, the most one '
                "caller may: wait for one of them to be served, or stop one"
            )
        if len(self._waiting) >= self.limit:
            raise QueueRefused(
                f"{len(self._waiting)} requests already wait for a GPU on this node, the most "
                "the queue holds: try again later"
            )
        request = Request(next(self._tickets), namespace, pod, caller, model, now, priority)
        self._waiting[request.ticket] = request
        return request

    def leave(self, ticket: int) -> Request | None:
        """The request withdrawn (Ctrl-C in the notebook, the pod gone); None if it was
        not waiting (served meanwhile, or never queued)."""
        return self._waiting.pop(ticket, None)

    def waiting(self, model: str | None = None) -> list[Request]:
        """Every waiting request (of `model`; one for any model, `""`, waits for each),
        in arrival order."""
        found = (r for r in self._waiting.values() if model is None or r.model in (model, ""))
        return sorted(found, key=lambda r: r.ticket)

    def order(self, model: str) -> list[Request]:
        """The waiters for `model` in the order they would be served, one GPU at a time."""
        pending = self.waiting(model)
        served = dict(self._last_served)
        serves = self._serves
        ordered: list[Request] = []
        while pending:
            best = min(pending, key=lambda r: _rank(r, served))
            ordered.append(best)
            pending.remove(best)
            serves += 1
            served[best.namespace] = serves
        return ordered

    def next_for(self, model: str) -> Request | None:
        """Who a GPU of `model` that frees now goes to (not yet served: see `serve`)."""
        ordered = self.order(model)
        return ordered[0] if ordered else None

    def serve(self, ticket: int) -> Request:
        """The request leaves the queue with its GPU; its namespace was served now."""
        request = self._waiting.pop(ticket)
        self._serves += 1
        self._last_served[request.namespace] = self._serves
        return request

    def position(self, ticket: int) -> int | None:
        """1 for the next to be served among the waiters for its model; None if not
        waiting."""
        request = self._waiting.get(ticket)
        if request is None:
            return None
        return next(i for i, r in enumerate(self.order(request.model), 1) if r.ticket == ticket)

    def __len__(self) -> int:
        return len(self._waiting)


def _rank(request: Request, served: dict[str, int]) -> tuple[int, int, int]:
    return (-request.priority, served.get(request.namespace, 0), request.ticket)


def ordinal(place: int) -> str:
    """1 -> 1st, 2 -> 2nd, 11 -> 11th, 23 -> 23rd: `waiting for a GPU: 2nd in line`."""
    suffix = "th" if 11 <= place % 100 <= 13 else {1: "st", 2: "nd", 3: "rd"}.get(place % 10, "th")
    return f"{place}{suffix}"


def estimate(position: int, gpus: int, recent_holds: Sequence[float]) -> float | None:
    """Seconds a waiter at `position` may wait: the GPUs of its model free one by one
    after a typical hold (the median of the recent ones), `gpus` at a time. None with no
    hold seen yet (an estimate from nothing is a guess, not shown)."""
    if not recent_holds or gpus < 1 or position < 1:
        return None
    rounds = (position + gpus - 1) // gpus
    return rounds * statistics.median(recent_holds)
