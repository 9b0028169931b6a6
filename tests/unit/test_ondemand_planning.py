"""Who gets which GPU now (agent/ondemand/planning.py): free GPUs first, then the GPUs of
the on-demand pods idle longest past the minimum hold, never a busy one; each model's
waiters in order, none served past the head of its line."""

from __future__ import annotations

from agent.kube.client import PodInfo
from agent.ondemand.handover import Tracked
from agent.ondemand.planning import plan, victims
from agent.ondemand.policy import OnDemand
from hotmount.api import Candidate

A100, L4 = "NVIDIA A100", "NVIDIA L4"


def pod(name: str, model: str = A100, attached: float | None = None,
        idle: float | None = None, busy: bool = False) -> Tracked:  # fmt: skip
    info = PodInfo("ml", name, f"uid-{name}", "node-a", "Running", [])
    tracked = Tracked(info, "main", f"cid-{name}", "alice", OnDemand(), model)
    tracked.attached_at, tracked.idle_since, tracked.busy = attached, idle, busy
    return tracked


def gpu(key: str, model: str = A100) -> Candidate:
    return Candidate(key, f"GPU-{key}", model)


def held(tracked: Tracked) -> list[str]:
    return [f"gpu-of-{tracked.info.name}"]


def test_victims_are_idle_past_the_minimum_hold_idle_longest_first() -> None:
    pods = [
        pod("recent", attached=95, idle=96),  # idle, but held 5 s only
        pod("idle-short", attached=0, idle=90),
        pod("idle-long", attached=10, idle=40),
        pod("training", attached=0, busy=True),  # a cell runs: never, however long held
        pod("waiting"),  # holds nothing
    ]
    refused = pod("refused", attached=0, idle=1)
    refused.refused_until = 200  # its suspend was refused lately
    chosen = victims([*pods, refused], now=100, min_hold=30)
    assert [t.info.name for t in chosen] == ["idle-long", "idle-short"]


def test_a_free_gpu_first_then_the_gpu_of_the_longest_idle_pod() -> None:
    first, second = pod("first"), pod("second")
    idle = [pod("idle-long", attached=0, idle=10), pod("idle-short", attached=0, idle=50)]
    tasks = plan([[(first, 1), (second, 2)]], [gpu("free-0")], idle, held)
    assert [(t.waiter, t.keys, [v.info.name for v in t.victims]) for t in tasks] == [
        (first, ["free-0"], []),
        (second, ["gpu-of-idle-long"], ["idle-long"]),
    ]


def test_no_waiter_is_served_past_the_head_of_its_models_line() -> None:
    """Nothing for the head (no free A100, no idle A100): the one behind it waits too,
    even though an L4 is free; a waiter of the L4's line is served."""
    head, behind, l4_waiter = pod("head"), pod("behind"), pod("l4", model=L4)
    tasks = plan([[(head, 1), (behind, 2)], [(l4_waiter, 3)]], [gpu("l4-0", L4)], [], held)
    assert [t.waiter for t in tasks] == [l4_waiter]


def test_a_waiter_of_any_model_takes_any_and_learns_its_model() -> None:
    anyone = pod("anyone", model="")
    [task] = plan([[(anyone, 1)]], [gpu("l4-0", L4)], [], held)
    assert (task.keys, task.model) == (["l4-0"], L4)


def test_a_waiter_in_a_hand_over_already_is_left_out() -> None:
    moving = pod("moving")
    moving.moving = True
    nxt = pod("next")
    [task] = plan([[(moving, 1), (nxt, 2)]], [gpu("free-0")], [], held)
    assert task.waiter is nxt
