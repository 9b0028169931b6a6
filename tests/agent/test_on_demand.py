"""On-demand GPUs over HTTP (issue 42): three notebook pods on two GPUs, a real agent with
the stand-in driver (tests/support/cuda_standin.py), real runc containers, the fake
cluster. A cell acquires, the queue orders the waiters, an idle GPU is suspended for a
waiter and never a busy one, the suspended pod resumes onto whichever GPU is free with its
CUDA memory intact, and giving up a place leaves nothing behind."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.agent.conftest import ALICE, BOB, METRICS
from tests.agent.test_accounting import pins_of
from tests.support.cuda_standin import (
    UUID_A,
    UUID_B,
    A,
    B,
    StandIn,
    nvml_config,
    start_cuda,
    status,
)
from tests.support.suspend_world import World, standin_fixture  # noqa: F401 (a fixture)
from tests.support.waiting import wait_for

pytestmark = pytest.mark.kernel
PODS = "/v1/namespaces/default/pods"
ON_DEMAND = {"hotmount.io/gpu-on-demand": "1", "hotmount.io/gpu-on-demand-idle": "1h"}


@pytest.fixture(name="world")
def on_demand_world(tmp_path: Path, standin: StandIn) -> Iterator[World]:
    """The stand-in world, its agent keeping a GPU one second at least for a waiter."""
    made = World(tmp_path, standin, args=("--on-demand-min-hold", "1"))
    try:
        yield made
    finally:
        made.close()


def acquire(api: httpx.Client, pod: str, wait: float = 10.0) -> dict[str, Any]:
    """The pod's acquire; a free GPU is attached within `wait` (the hand-over thread
    serves every call, a free GPU at once)."""
    answer = api.post(f"{PODS}/{pod}/acquire", json={"waitSeconds": wait}, timeout=wait + 30)
    assert answer.status_code == 200, answer.text
    return answer.json()


def release(api: httpx.Client, pod: str, leave: bool = False) -> dict[str, Any]:
    answer = api.post(f"{PODS}/{pod}/release", json={"leave": leave})
    assert answer.status_code == 200, answer.text
    return answer.json()


def metric(world: World, line: str) -> bool:
    with world.agent.client(METRICS) as scraper:
        return line in scraper.get("/metrics").text


def test_three_notebooks_share_two_gpus_on_demand(world: World) -> None:
    first = world.cluster.pod("nb1", annotations=ON_DEMAND)
    for name in ("nb2", "nb3"):
        world.cluster.pod(name, annotations=ON_DEMAND)
    with world.agent.client(ALICE) as api:
        got = acquire(api, "nb1")
        assert (got["state"], got["devices"]) == ("attached", [A]), got
        proc, pid = start_cuda(first)
        world.processes.append(proc)
        nvml_config(world.nvml_config, [pid])
        assert release(api, "nb1")["state"] == "idle"  # its cell ended: idle, not taken yet

        assert acquire(api, "nb2")["devices"] == [B]  # a cell runs in nb2 from here on
        waiting = acquire(api, "nb3", wait=0)
        assert waiting["state"] == "waiting" and waiting["position"] == 1, waiting
        assert waiting["message"].startswith("waiting for a GPU: 1st in line"), waiting

        # nb1 idle (held past the minimum hold, 1s here), nb2 busy: nb1's GPU goes to nb3
        served = acquire(api, "nb3", wait=15)
        assert (served["state"], served["devices"]) == ("attached", [A]), served
        assert status(first) == "checkpointed - pattern=ok"
        assert metric(world, 'hotmount_ondemand_suspends_total{why="waiter"} 1.0')

        # nb1's next cell waits: nb2 and nb3 run cells, and a busy GPU is never taken
        queued = acquire(api, "nb1", wait=2)
        assert queued["state"] == "waiting" and queued["position"] == 1, queued
        assert acquire(api, "nb2")["devices"] == [B] and acquire(api, "nb3")["devices"] == [A]
        listed = api.get("/v1/devices").json()
        assert [(q["pod"], q["position"]) for q in listed["queue"]] == [("nb1", 1)], listed
        assert metric(world, "hotmount_ondemand_queue_length 1.0")

        # nb2's cell ends: its GPU goes to nb1, whose CUDA memory comes back on GPU B
        release(api, "nb2")
        back = acquire(api, "nb1", wait=15)
        assert (back["state"], back["resumed"]) == ("attached", {A: B}), back
        assert status(first) == "running /dev/nvidia1 pattern=ok"
        assert acquire(api, "nb3")["devices"] == [A]  # still nb3's: busy all along

        # Ctrl-C while waiting: the place is given up, nothing is left queued
        assert acquire(api, "nb2", wait=0)["state"] == "waiting"
        assert release(api, "nb2", leave=True)["state"] == "left"
        assert api.get("/v1/devices").json()["queue"] == []
    assert metric(world, "hotmount_ondemand_queue_length 0.0")
    assert metric(world, 'hotmount_ondemand_attaches_total{how="resume"} 1.0')
    assert metric(world, 'hotmount_ondemand_attaches_total{how="first"} 3.0')


def test_an_idle_gpu_is_suspended_after_the_pods_idle_time_without_a_warning(
    world: World,
) -> None:
    container = world.cluster.pod(
        "nb", annotations={**ON_DEMAND, "hotmount.io/gpu-on-demand-idle": "1s"}
    )
    with world.agent.client(ALICE) as api:
        assert acquire(api, "nb")["devices"] == [A]
        proc, pid = start_cuda(container)
        world.processes.append(proc)
        nvml_config(world.nvml_config, [pid])
        release(api, "nb")
        wait_for(lambda: world.cluster.events("GPUSuspended"), "the idle suspend", timeout=20)
        assert status(container) == "checkpointed - pattern=ok"
        again = acquire(api, "nb", wait=10)
        assert again["state"] == "attached" and again["resumed"] == {A: A}, again
    assert status(container) == "running /dev/nvidia0 pattern=ok"
    assert not world.cluster.events("GPUIdleSoon")  # no warning first: the next cell resumes


def test_a_gpu_the_kubelet_gave_an_ordinary_pod_is_never_handed_out(world: World) -> None:
    """GPU A is an ordinary pod's (the kubelet gave it): the notebook gets B, and a second
    notebook waits rather than take A."""
    world.cluster.pod("trainer")
    world.cluster.kubelets["node-a"].set_allocation(
        "default", "trainer", "main", "nvidia.com/gpu", [UUID_A]
    )
    for name in ("nb1", "nb2"):
        world.cluster.pod(name, annotations=ON_DEMAND)
    with world.agent.client(ALICE) as api:
        assert acquire(api, "nb1")["devices"] == [B]
        assert acquire(api, "nb2", wait=3)["state"] == "waiting"
        [listed] = api.get(f"{PODS}/trainer/devices").json()["containers"] or [{"devices": []}]
        assert listed["devices"] == []  # nothing hot-mounted into the ordinary pod either


def test_another_tenant_may_neither_acquire_nor_release_a_pods_gpu(world: World) -> None:
    """Bob has no rights on the pod: his acquire and release are refused (403, before any
    queue or GPU work), and his leave cannot take a waiting notebook's place."""
    for name in ("nb1", "nb2", "nb3"):
        world.cluster.pod(name, annotations=ON_DEMAND)
    with world.agent.client(ALICE) as api:
        assert acquire(api, "nb1")["devices"] and acquire(api, "nb2")["devices"]
        assert acquire(api, "nb3", wait=0)["state"] == "waiting"
        with world.agent.client(BOB) as bob:
            for verb, body in (("acquire", {}), ("release", {"leave": True}), ("release", {})):
                refused = bob.post(f"{PODS}/nb3/{verb}", json=body)
                assert refused.status_code == 403, refused.text
            assert bob.post(f"{PODS}/nb1/release", json={}).status_code == 403
        assert [q["pod"] for q in api.get("/v1/devices").json()["queue"]] == ["nb3"]
        assert acquire(api, "nb1", wait=0)["state"] == "attached"  # still nb1's, busy


def test_a_pod_that_does_not_ask_is_refused_and_nothing_changes(world: World) -> None:
    world.cluster.pod("plain")
    world.cluster.pod("typo", annotations={"hotmount.io/gpu-on-demand": "count=two"})
    with world.agent.client(ALICE) as api:
        plain = api.post(f"{PODS}/plain/acquire", json={})
        assert plain.status_code == 400, plain.text
        assert "hotmount.io/gpu-on-demand" in plain.json()["message"]
        typo = api.post(f"{PODS}/typo/acquire", json={})
        assert typo.status_code == 400 and "'two' is not a whole number" in typo.text, typo.text
        assert api.post(f"{PODS}/plain/acquire", json={"waitSeconds": 21}).status_code == 422
        for pod in ("plain", "typo"):
            listed = api.get(f"{PODS}/{pod}/devices").json()["containers"]
            assert all(not c["devices"] for c in listed), listed
        assert api.get("/v1/devices").json()["queue"] == []


@pytest.fixture(name="plugin_world")
def plugin_world_fixture(tmp_path: Path, standin: StandIn) -> Iterator[World]:
    """node-a's device plugin offers both stand-in GPUs: every on-demand GPU is pinned."""
    made = World(tmp_path, standin, gpus=[UUID_A, UUID_B], args=("--holder-orphan-grace", "0"))
    try:
        yield made
    finally:
        made.close()


def test_the_pin_and_the_quota_follow_the_gpu(plugin_world: World) -> None:
    """An attached GPU is pinned (and charged to the quota); a suspended one is not, so
    an ordinary pod gets it; the quota full while a cell asks is a quota refusal (exit 7
    in nvcli) with nothing changed."""
    world = plugin_world
    quick = {**ON_DEMAND, "hotmount.io/gpu-on-demand-idle": "1s"}
    world.cluster.pod("nb1", annotations=quick)
    world.cluster.pod("nb2", annotations=ON_DEMAND)
    world.cluster.kube.set_gpu_quota("default", "one-gpu", 1)
    with world.agent.client(ALICE) as api:
        assert acquire(api, "nb1")["devices"] == [A]
        assert len(pins_of(world.cluster, "nb1")) == 1
        refused = api.post(f"{PODS}/nb2/acquire", json={"waitSeconds": 10})
        assert refused.status_code == 403, refused.text
        assert refused.json()["reason"] == "QuotaExceeded"
        assert "one-gpu" in refused.json()["message"], refused.text
        assert pins_of(world.cluster, "nb2") == [] and api.get("/v1/devices").json()["queue"] == []
        nvcli = Path(sys.executable).parent / "nvcli"
        argv = [str(nvcli), "acquire", "--name", "nb2", "-n", "default"]
        done = subprocess.run([*argv, "--agent", world.agent.url, "--token", ALICE],
                              check=False, capture_output=True, text=True, timeout=60)  # fmt: skip
        assert done.returncode == 7 and "one-gpu" in done.stderr, done.stderr

        release(api, "nb1")  # idle 1s: suspended, its pin deleted, GPU A free for anyone
        wait_for(lambda: not pins_of(world.cluster, "nb1"), "the pin deleted at suspend")
        assert sorted(world.cluster.kube.free_devices("node-a")) == sorted([UUID_A, UUID_B])
        assert acquire(api, "nb2")["state"] == "attached"  # the quota's one GPU, now free
        assert len(pins_of(world.cluster, "nb2")) == 1


def test_waiting_cells_take_no_mount_slot_nor_every_worker(world: World) -> None:
    """Twelve notebooks wait for the two GPUs, each on a call of its own, more than the
    agent's mutating slots (8) and its cap on waiting calls (16 is not reached, 12 wait
    on threads): an unmount beside them is answered at once, not queued behind them."""
    tokens = []
    for i in range(12):
        world.cluster.pod(f"nb{i}", annotations=ON_DEMAND)
        token = f"nb{i}-token"
        world.cluster.kube.add_token(token, f"nb{i}", ["ops"])  # a caller each (its pod)
        tokens.append(token)
    world.cluster.pod("holder", annotations=ON_DEMAND)
    world.cluster.pod("other", annotations=ON_DEMAND)
    with world.agent.client(ALICE) as api:
        assert acquire(api, "holder")["devices"] == [A] and acquire(api, "other")["devices"] == [B]

    def wait_in_line(i: int) -> dict[str, Any]:
        with world.agent.client(tokens[i]) as api:
            return acquire(api, f"nb{i}", wait=15)

    with ThreadPoolExecutor(12) as pool:
        waiting = [pool.submit(wait_in_line, i) for i in range(12)]
        with world.agent.client(ALICE) as api:
            wait_for(lambda: len(api.get("/v1/devices").json()["queue"]) == 12, "12 in line")
            unmounted = api.delete(f"{PODS}/other/devices/{B}")
            assert unmounted.status_code == 200, unmounted.text  # not 429 after 10 s
            released = release(api, "holder", leave=False)
            assert released["state"] == "idle"
        answers = [f.result() for f in waiting]
    attached = [a for a in answers if a["state"] == "attached"]
    assert len(attached) == 2, answers  # B (unmounted) and A (holder idle past 1s)
    assert {a["devices"][0] for a in attached} == {A, B}


def test_nvcli_acquire_shows_its_place_and_ctrl_c_gives_it_up(world: World) -> None:
    """`nvcli acquire` on a pod whose GPUs are all busy prints its place within a second,
    and Ctrl-C (SIGINT) gives the place up before nvcli exits 130."""
    for name in ("nb1", "nb2", "nb3"):
        world.cluster.pod(name, annotations=ON_DEMAND)
    with world.agent.client(ALICE) as api:
        assert acquire(api, "nb1")["devices"] and acquire(api, "nb2")["devices"]  # both busy
        nvcli = Path(sys.executable).parent / "nvcli"
        argv = [str(nvcli), "acquire", "--name", "nb3", "-n", "default"]
        with subprocess.Popen([*argv, "--agent", world.agent.url, "--token", ALICE],
                              stderr=subprocess.PIPE, text=True) as waiting:  # fmt: skip
            assert waiting.stderr is not None
            assert waiting.stderr.readline().startswith("waiting for a GPU: 1st in line")
            assert api.get("/v1/devices").json()["queue"][0]["pod"] == "nb3"
            waiting.send_signal(signal.SIGINT)
            rest = waiting.stderr.read()
            assert waiting.wait(timeout=30) == 130, rest
        assert "the place is given up" in rest, rest
        assert api.get("/v1/devices").json()["queue"] == []
