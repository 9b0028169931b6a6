"""The on-demand queue's rules (agent/ondemand/queue.py): priority, fairness across
namespaces, first come first served within one, bounds, and the GPU chosen to suspend."""

from __future__ import annotations

import pytest

from agent.ondemand.queue import (
    FairQueue,
    QueueRefused,
    estimate,
    ordinal,
)

A100 = "NVIDIA A100"


def pods(queue: FairQueue, model: str = A100) -> list[str]:
    return [f"{r.namespace}/{r.pod}" for r in queue.order(model)]


def test_one_namespace_is_first_come_first_served() -> None:
    queue = FairQueue(per_caller=10)
    for i in range(3):
        queue.join("ml", f"nb-{i}", "alice", A100, now=i)
    assert pods(queue) == ["ml/nb-0", "ml/nb-1", "ml/nb-2"]


def test_a_namespace_with_many_waiters_does_not_starve_one_that_came_later() -> None:
    queue = FairQueue(per_caller=10)
    for i in range(4):
        queue.join("big", f"nb-{i}", f"user-{i}", A100, now=i)
    queue.join("small", "nb", "bob", A100, now=10)
    # small's one cell is served second, after big's first: not after all four
    assert pods(queue) == ["big/nb-0", "small/nb", "big/nb-1", "big/nb-2", "big/nb-3"]
    assert queue.position(5) == 2


def test_the_namespace_served_least_recently_goes_first() -> None:
    queue = FairQueue(per_caller=10)
    first = queue.join("a", "nb-1", "u1", A100, now=0)
    queue.join("a", "nb-2", "u2", A100, now=1)
    queue.join("b", "nb-1", "u3", A100, now=2)
    queue.serve(first.ticket)  # a was just served
    assert pods(queue) == ["b/nb-1", "a/nb-2"]


def test_a_higher_priority_is_served_before_any_lower() -> None:
    queue = FairQueue(per_caller=10)
    queue.join("a", "nb-1", "u1", A100, now=0)
    queue.join("b", "nb-1", "u2", A100, now=1, priority=5)
    assert pods(queue) == ["b/nb-1", "a/nb-1"]


def test_each_model_has_its_own_line() -> None:
    queue = FairQueue(per_caller=10)
    queue.join("a", "nb-1", "u1", A100, now=0)
    h100 = queue.join("a", "nb-2", "u1", "NVIDIA H100", now=1)
    assert queue.position(h100.ticket) == 1
    assert queue.next_for("NVIDIA H100") == h100
    assert queue.next_for("NVIDIA L4") is None


def test_asking_again_while_waiting_keeps_the_place() -> None:
    queue = FairQueue()
    first = queue.join("ml", "nb", "alice", A100, now=0)
    assert queue.join("ml", "nb", "alice", A100, now=30) == first
    assert len(queue) == 1


def test_one_caller_holds_at_most_its_share_of_places_and_nothing_is_queued_past_it() -> None:
    queue = FairQueue(per_caller=2)
    queue.join("ml", "nb-1", "alice", A100, now=0)
    queue.join("ml", "nb-2", "alice", A100, now=1)
    with pytest.raises(QueueRefused, match='user "alice" already waits for 2 GPUs'):
        queue.join("ml", "nb-3", "alice", A100, now=2)
    assert len(queue) == 2
    queue.join("ml", "nb-3", "bob", A100, now=3)  # another caller still may


def test_a_full_queue_refuses_with_a_reason() -> None:
    queue = FairQueue(per_caller=5, limit=2)
    queue.join("a", "nb-1", "u1", A100, now=0)
    queue.join("b", "nb-1", "u2", A100, now=0)
    with pytest.raises(QueueRefused, match="2 requests already wait"):
        queue.join("c", "nb-1", "u3", A100, now=0)


def test_leaving_frees_the_place_and_moves_the_line_up() -> None:
    queue = FairQueue(per_caller=10)
    first = queue.join("a", "nb-1", "u", A100, now=0)
    second = queue.join("a", "nb-2", "u", A100, now=1)
    assert queue.leave(first.ticket) == first
    assert queue.leave(first.ticket) is None
    assert queue.position(second.ticket) == 1
    assert queue.position(first.ticket) is None


def test_ordinals_read_as_english() -> None:
    assert [ordinal(n) for n in (1, 2, 3, 4, 11, 12, 13, 21, 22, 23, 101, 111)] == [
        "1st", "2nd", "3rd", "4th", "11th", "12th", "13th", "21st", "22nd", "23rd", "101st",
        "111th",
    ]  # fmt: skip


def test_the_estimate_counts_rounds_of_typical_holds() -> None:
    assert estimate(1, 2, [10.0, 30.0, 20.0]) == 20.0
    assert estimate(3, 2, [10.0, 30.0, 20.0]) == 40.0  # the second round of two GPUs
    assert estimate(2, 1, []) is None  # nothing seen: no guess
