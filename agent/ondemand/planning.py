"""Which waiting on-demand pod gets which GPU now (agent/ondemand/arbiter.py starts the
hand-overs). Pure: the arbiter gives the waiters in order, the free GPUs and the pods whose
GPUs may be taken, and gets the hand-overs back.

- In each model's order (queue.py), a waiter gets free GPUs of its model first, else the
  GPUs of on-demand pods idle longest past the minimum hold, never of one whose cell runs
  (`victims`). A waiter of any model (`""`) takes any.
- A model's waiters are served in order: once one cannot be, the ones behind it wait
  too, so a GPU freeing never goes past the head of the line.
- A waiter or victim already in a hand-over (`moving`) is left out.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from agent.errors import QuotaExceeded
from agent.ondemand.handover import TAKEN, Tracked
from hotmount.api import Candidate, NoGpuFree


@dataclass(frozen=True)
class HandOverTask:
    """A waiter served now: onto `keys`, once `victims` (idle on-demand pods) are
    suspended; `model`: NVML's name of those GPUs."""

    waiter: Tracked
    ticket: int
    keys: list[str]
    victims: list[Tracked]
    model: str


def taken(exc: BaseException) -> bool:
    """A GPU planned was taken meanwhile (another pod, a hot-mount): try again later. A
    quota with no room is not that, whatever it was found through (a pin unschedulable)."""
    if isinstance(exc, QuotaExceeded) or isinstance(exc.__cause__, QuotaExceeded):
        return False
    return isinstance(exc, NoGpuFree | TAKEN) or isinstance(exc.__cause__, NoGpuFree | TAKEN)


def victims(pods: Iterable[Tracked], now: float, min_hold: float) -> list[Tracked]:
    """On-demand pods whose GPUs may go to a waiter, idle longest first: attached, no cell
    running, held `min_hold` at least, no suspend refused lately."""
    eligible = [
        t for t in pods
        if t.attached_at is not None and not t.busy and not t.moving
        and now - t.attached_at >= min_hold and t.refused_until <= now
    ]  # fmt: skip
    return sorted(eligible, key=lambda t: t.idle_since or t.attached_at or 0.0)


def plan(
    lines: Sequence[Sequence[tuple[Tracked, int]]],
    free: list[Candidate],
    idle: list[Tracked],
    held: Callable[[Tracked], list[str]],
) -> list[HandOverTask]:
    """The hand-overs to start: `lines`, each model's waiters in order (with their
    tickets); `free`, the free GPUs; `idle`, victims() in order; `held`, a pod's GPUs."""
    free, idle = list(free), list(idle)
    tasks: list[HandOverTask] = []
    planned: set[int] = set()
    for line in lines:
        for waiter, ticket in line:
            if waiter.moving or id(waiter) in planned:
                continue
            task = _assign(waiter, ticket, free, idle, held)
            if task is None:
                break  # the ones behind it in this model's order wait too
            planned.add(id(waiter))
            tasks.append(task)
    return tasks


def _assign(
    waiter: Tracked,
    ticket: int,
    free: list[Candidate],
    idle: list[Tracked],
    held: Callable[[Tracked], list[str]],
) -> HandOverTask | None:
    """The GPUs (and victims) for `waiter`, taken off `free` and `idle`; None when there
    are not enough."""
    need, model = waiter.wants.count, waiter.model
    mine = [g for g in free if not model or g.model == model][:need]
    model = model or (mine[0].model or "" if mine else "")
    chosen: list[Tracked] = []
    keys = [g.key for g in mine]
    for victim in idle:
        if len(keys) >= need:
            break
        if victim is waiter or (model and victim.model != model):
            continue
        chosen.append(victim)
        keys += held(victim)
        model = model or victim.model
    if len(keys) < need:
        return None
    for gpu in mine:
        free.remove(gpu)
    for victim in chosen:
        idle.remove(victim)
    return HandOverTask(waiter, ticket, keys[:need], chosen, model)
