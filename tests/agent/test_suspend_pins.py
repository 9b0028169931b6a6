"""A resumed GPU gets its books back (issue 33 with issue 32's pins): the suspend deletes
the pin, the resume pins the GPU it mounts through the mount by name's own path before
it answers, a refused pin leaves the suspension as it was and nothing behind, and a
crash between the pin and the restore is repaired by reconcile. A real agent with the
stand-in driver (tests/support/cuda_standin.py), real runc containers, and the fake API
server's scheduler and kubelet, whose device plugin (and, for DRA, whose ResourceSlice)
offers the stand-in's two GPUs: the first free GPU goes to whoever asks.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hotmount.state.ledger import Ledger
from tests.agent.conftest import ALICE
from tests.agent.test_accounting import gpu_pod, pins_of
from tests.agent.test_pins_at_admission import blockers
from tests.fakes.dra import nvidia_slice
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


@pytest.fixture(name="world")
def plugin_world(tmp_path: Path, standin: StandIn) -> Iterator[World]:
    """node-a's device plugin offers both stand-in GPUs: a mount by name is pinned."""
    made = World(tmp_path, standin, gpus=[UUID_A, UUID_B], args=("--holder-orphan-grace", "0"))
    try:
        yield made
    finally:
        made.close()


def given(world: World, pod: str) -> list[str]:
    """The GPU UUIDs the fake kubelet gave `pod`."""
    containers = world.cluster.kubelets["node-a"].allocations().get(("default", pod), {})
    return sorted(d for res in containers.values() for ids in res.values() for d in ids)


def pin_name(world: World, pod: str = "nb") -> str:
    [pin] = pins_of(world.cluster, pod)
    return str(pin["metadata"]["name"])


def listed(world: World, pod: str = "nb") -> dict[str, Any]:
    with world.agent.client(ALICE) as api:
        [device] = api.get(f"{PODS}/{pod}/devices").json()["containers"][0]["devices"]
    return dict(device)


def call(world: World, verb: str, pod: str = "nb", **body: Any) -> Any:
    with world.agent.client(ALICE) as api:
        return api.post(f"{PODS}/{pod}/{verb}", json=body)


def test_a_resume_pins_its_gpu_again(world: World) -> None:
    """The suspend frees the GPU in the kubelet's books; the resume's new pin holds it
    again before the answer, so an ordinary GPU pod is given the other GPU."""
    container, _ = world.notebook()
    first = pin_name(world)
    assert given(world, first) == [UUID_A]
    assert call(world, "suspend").status_code == 200
    assert pins_of(world.cluster, "nb") == []
    assert sorted(world.cluster.kube.free_devices("node-a")) == sorted([UUID_A, UUID_B])

    resumed = call(world, "resume")
    assert resumed.status_code == 200, resumed.text
    assert resumed.json()["resumed"] == {A: A}
    assert status(container) == "running /dev/nvidia0 pattern=ok"
    second = pin_name(world)
    assert second != first and given(world, second) == [UUID_A]
    assert listed(world)["pin"] == second
    assert blockers(world.cluster) == []

    gpu_pod(world.cluster, "trainer")
    assert given(world, "trainer") == [UUID_B]
    # The pin is the mount's, as after a mount by name: the unmount deletes it (forced:
    # the CUDA process holds the GPU open).
    with world.agent.client(ALICE) as api:
        assert api.delete(f"{PODS}/nb/devices/{A}?force=true").status_code == 200
    assert pins_of(world.cluster, "nb") == []


def test_a_gpu_mounted_by_count_resumes_pinned_and_still_by_count(world: World) -> None:
    """The kubelet cannot be asked for one GPU by count: the resume pins the GPU it
    mounts, and the ledger keeps it a mount by count (what `apply` and moves go by)."""
    container = world.cluster.pod("nb")
    with world.agent.client(ALICE) as api:
        mounted = api.post(f"{PODS}/nb/devices", json={"count": 1})
    assert mounted.status_code == 200, mounted.text
    assert [d["key"] for d in mounted.json()["mounted"]] == [A]
    proc, pid = start_cuda(container)
    world.processes.append(proc)
    nvml_config(world.nvml_config, [pid])
    assert call(world, "suspend").status_code == 200
    assert given_any(world) == []  # the count holder went with the suspension

    resumed = call(world, "resume")
    assert resumed.status_code == 200, resumed.text
    assert status(container) == "running /dev/nvidia0 pattern=ok"
    pin = pin_name(world)
    assert given(world, pin) == [UUID_A]
    record = Ledger(world.cluster.workdir / "state-node-a").load(container.id)
    assert record is not None
    metadata = record.devices[A].metadata
    assert metadata["holder"] == pin and "holderKind" not in metadata


def given_any(world: World) -> list[str]:
    """Every GPU the fake kubelet has given to any pod."""
    table = world.cluster.kubelets["node-a"].allocations()
    return sorted(d for c in table.values() for r in c.values() for ids in r.values() for d in ids)


def test_a_gpu_given_away_meanwhile_resumes_onto_the_other_gpu_pinned(world: World) -> None:
    """While suspended, an ordinary pod is given the notebook's GPU: the resume moves the
    memory onto the other GPU and pins that one; no GPU is left free in the books."""
    container, _ = world.notebook()
    assert call(world, "suspend").status_code == 200
    gpu_pod(world.cluster, "trainer")
    assert given(world, "trainer") == [UUID_A]

    resumed = call(world, "resume")
    assert resumed.status_code == 200, resumed.text
    assert resumed.json()["resumed"] == {A: B}
    assert status(container) == "running /dev/nvidia1 pattern=ok"
    assert given(world, pin_name(world)) == [UUID_B]
    assert world.cluster.kube.free_devices("node-a") == []


def test_a_pin_refused_for_a_taken_gpu_tries_the_other(world: World) -> None:
    """The kubelet still lists a pod the API server no longer has on GPU A (a pod whose
    deletion has not reached the kubelet): A looks free, but its pin is refused; the
    resume pins B instead and moves onto it."""
    container, _ = world.notebook()
    assert call(world, "suspend").status_code == 200
    world.cluster.kubelets["node-a"].set_allocation(
        "default", "gone", "main", "nvidia.com/gpu", [UUID_A]
    )
    resumed = call(world, "resume")
    assert resumed.status_code == 200, resumed.text
    assert resumed.json()["resumed"] == {A: B}
    assert status(container) == "running /dev/nvidia1 pattern=ok"
    assert given(world, pin_name(world)) == [UUID_B]


def test_a_pin_refused_by_the_quota_keeps_the_suspension(world: World) -> None:
    """No room in the namespace's quota: 409 PinRefused naming the quota, nothing
    mounted, no pin nor blocker left, both GPUs free, the process still checkpointed;
    with room again the resume goes through."""
    container, _ = world.notebook()
    assert call(world, "suspend").status_code == 200
    world.cluster.kube.set_gpu_quota("default", "no-gpus", 0)

    refused = call(world, "resume")
    assert refused.status_code == 409, refused.text
    assert refused.json()["reason"] == "PinRefused"
    assert "no-gpus" in refused.json()["message"]
    assert refused.json()["message"].endswith("the suspension is kept as it was")
    assert status(container) == "checkpointed - pattern=ok"
    assert "nvidia0" not in container.ls_dev()
    assert listed(world)["state"] == "suspended"
    assert pins_of(world.cluster, "nb") == [] and blockers(world.cluster) == []
    assert sorted(world.cluster.kube.free_devices("node-a")) == sorted([UUID_A, UUID_B])

    world.cluster.kube.set_gpu_quota("default", "one-gpu", 1)
    resumed = call(world, "resume")
    assert resumed.status_code == 200, resumed.text
    assert status(container) == "running /dev/nvidia0 pattern=ok"
    assert given(world, pin_name(world)) == [UUID_A]


def test_a_crash_between_the_pin_and_the_restore_finishes_with_the_pin(world: World) -> None:
    """The agent dies while the restore waits on the process (stopped, so it cannot
    answer): the GPU is mounted with its new pin, the step `restoring` recorded. The
    next agent's reconcile finishes the restore; the pin stays, named by the mount."""
    container, pid = world.notebook()
    assert call(world, "suspend").status_code == 200
    ledger = Ledger(world.cluster.workdir / "state-node-a")
    key = container.id

    def at_restoring() -> bool:
        record = ledger.load(key)
        return bool(record and record.suspension and record.suspension.step == "restoring")

    answer: dict[str, Any] = {}
    resume = threading.Thread(target=lambda: answer.update(r=_quietly(call, world, "resume")))
    os.kill(pid, signal.SIGSTOP)
    try:
        resume.start()
        wait_for(at_restoring, "the resume reaches its restore")
        pin = pin_name(world)
        assert given(world, pin) == [UUID_A]
        world.crash_and_restart()
    finally:
        os.kill(pid, signal.SIGCONT)
        resume.join(60)

    def repaired() -> bool:
        record = ledger.load(key)
        return bool(record and record.suspension is None)

    wait_for(repaired, "reconcile finishes the resume")
    assert status(container) == "running /dev/nvidia0 pattern=ok"
    assert pin_name(world) == pin and given(world, pin) == [UUID_A]
    assert listed(world)["pin"] == pin and listed(world)["state"] == "mounted"
    record = ledger.load(key)
    assert record is not None and record.devices[A].metadata["holder"] == pin


def _quietly(call_: Any, *args: Any) -> Any:
    """A call whose connection the crash cuts: its error, not an exception."""
    try:
        return call_(*args)
    except Exception as exc:
        return exc


@pytest.fixture(name="dra_world")
def dra_world_fixture(tmp_path: Path, standin: StandIn) -> Iterator[World]:
    """The stand-in's GPUs are DRA's (a ResourceSlice lists them), no plugin's."""
    made = World(tmp_path, standin, gpus=[], args=("--holder-orphan-grace", "0"))
    devices = {"gpu-0": ("gpu", UUID_A), "gpu-1": ("gpu", UUID_B)}
    made.cluster.kube.put_resource_slice(nvidia_slice("node-a", devices))
    try:
        yield made
    finally:
        made.close()


def test_a_dra_gpu_resumes_with_a_new_claim(dra_world: World) -> None:
    world = dra_world
    container, _ = world.notebook()
    first = pin_name(world)
    assert call(world, "suspend").status_code == 200
    wait_for(
        lambda: world.cluster.kube.resource_claim("default", first) is None,
        "the suspended GPU's claim goes with its pin",
    )
    resumed = call(world, "resume")
    assert resumed.status_code == 200, resumed.text
    assert status(container) == "running /dev/nvidia0 pattern=ok"
    second = pin_name(world)
    claim = world.cluster.kube.resource_claim("default", second)
    assert claim is not None
    [request] = claim["spec"]["devices"]["requests"]
    assert UUID_A in request["exactly"]["selectors"][0]["cel"]["expression"]
    [result] = claim["status"]["allocation"]["devices"]["results"]
    assert result["device"] == "gpu-0"


def test_a_crash_after_the_pin_before_the_mount_leaves_no_pin(world: World) -> None:
    """The agent dies as the resume's pin is made, before anything is mounted: the API
    server holds the pin's creation meanwhile, and makes it once the agent is gone, so
    the pin holds GPU A and a blocker GPU B with no agent to delete either. The next
    agent's reconcile deletes the pin nothing names and the blocker; the suspension is
    as it was, and a resume then goes through."""
    container, _ = world.notebook()
    assert call(world, "suspend").status_code == 200
    kube = world.cluster.kube
    first = kube.stall(verb="delete", resource="pods")  # A's blocker, before the pin
    answer: dict[str, Any] = {}
    resume = threading.Thread(target=lambda: answer.update(r=_quietly(call, world, "resume")))
    resume.start()
    second = None
    try:
        assert first.wait_arrived(1), "the resume never freed A's blocker"
        second = kube.stall(verb="create", resource="pods")  # the pin
        first.release()
        assert second.wait_arrived(1), "the resume never made its pin"
        world.agent.process.kill()
        world.agent.process.wait()
    finally:
        first.release()
        if second is not None:
            second.release()
        resume.join(60)
    pin = wait_for(lambda: pins_of(world.cluster, "nb"), "the held pin is made")[0]
    wait_for(lambda: given(world, pin["metadata"]["name"]) == [UUID_A], "the pin holds GPU A")
    assert len(blockers(world.cluster)) == 1
    world.restart()
    wait_for(lambda: pins_of(world.cluster, "nb") == [], "reconcile deletes the pin")
    wait_for(lambda: blockers(world.cluster) == [], "and the blocker")
    assert sorted(kube.free_devices("node-a")) == sorted([UUID_A, UUID_B])
    assert status(container) == "checkpointed - pattern=ok"
    assert listed(world)["state"] == "suspended"
    resumed = call(world, "resume")
    assert resumed.status_code == 200, resumed.text
    assert status(container) == "running /dev/nvidia0 pattern=ok"
    assert given(world, pin_name(world)) == [UUID_A]
