"""Idle policy `suspend` (issue 33 item 3): a real agent process with the stand-in driver
(tests/support/cuda_standin.py) and the fake NVML's utilization file, real runc
containers, the fake cluster. An idle GPU under `suspend` is warned, then suspended (its
CUDA process kept, its memory pattern intact after a resume); a refused suspension
stops nothing and leaves the GPU mounted. Time is counted by waiting for what the agent
reports (Events), never by asserting on the wall clock."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.agent.conftest import ALICE
from tests.agent.test_idle_reclaim import HUNG, counter, samples, wait_passes
from tests.fakes import nvml as fake_nvml
from tests.fakes.nvml import FakeActivity
from tests.support.cuda_standin import UUID_A, A, B, StandIn, status
from tests.support.runc import RuncContainer
from tests.support.suspend_world import (
    World,
    standin_fixture,  # noqa: F401 (fixtures)
)
from tests.support.waiting import wait_for

pytestmark = pytest.mark.kernel
PODS = "/v1/namespaces/default/pods"
IDLE = {"idleTimeout": "3s", "idlePolicy": "suspend"}


def activity_file(tmp: Path) -> Path:
    return tmp / "nvml-activity"


def idle_world(tmp: Path, standin: StandIn, driver_version: str = "13000") -> World:
    """A World whose agent judges use by NVML: GPU A busy until `go_idle`."""
    activity = fake_nvml.write_activity(activity_file(tmp), [FakeActivity(UUID_A, gpu=50)])
    return World(
        tmp,
        standin,
        args=("--use-nvml",),
        env_more=fake_nvml.with_activity({"FAKE_CUDA_DRIVER_VERSION": driver_version}, activity),
    )


@pytest.fixture
def world(tmp_path: Path, standin: StandIn) -> Iterator[World]:
    made = idle_world(tmp_path, standin)
    try:
        yield made
    finally:
        made.close()


@pytest.fixture
def old_driver(tmp_path: Path, standin: StandIn) -> Iterator[World]:
    made = idle_world(tmp_path, standin, driver_version="12030")  # driver 545: no checkpoint
    try:
        yield made
    finally:
        made.close()


def idle_notebook(world: World) -> tuple[RuncContainer, int]:
    """The notebook, its GPU under `suspend`, idle from now on (NVML: no activity): only
    once its CUDA process is known to NVML, with its 512 MiB."""
    container, pid = world.notebook(**IDLE)
    fake_nvml.write_activity(activity_file(world.cluster.workdir), [])
    return container, pid


def reasons(world: World) -> list[str]:
    wanted = ("GPUIdleSoon", "GPUSuspended", "GPUReclaimed", "GPUSuspendRefused")
    return [e["reason"] for e in world.cluster.kube.events() if e.get("reason") in wanted]


def devices(world: World) -> list[dict]:
    with world.agent.client(ALICE) as api:
        body = api.get(f"{PODS}/nb/devices").json()
    return [d for c in body["containers"] for d in c["devices"]]


def test_an_idle_gpu_under_suspend_is_warned_then_suspended_and_resumes_intact(
    world: World,
) -> None:
    container, pid = idle_notebook(world)
    assert devices(world)[0]["idlePolicy"] == "suspend"

    wait_for(
        lambda: world.cluster.events("GPUSuspended"),
        "the idle suspension",
        timeout=HUNG,
        show=lambda: (reasons(world), devices(world), world.agent.log.read_text()[-3000:]),
    )

    assert reasons(world) == ["GPUIdleSoon", "GPUSuspended"]  # the warning first, once
    [soon] = world.cluster.events("GPUIdleSoon")
    assert "suspended in" in soon["message"] and "policy suspend" in soon["message"]
    [event] = world.cluster.events("GPUSuspended")
    assert "1 processes kept, 512 MiB of GPU memory in host memory" in event["message"]
    assert os.path.exists(f"/proc/{pid}")  # the process lives on, checkpointed
    assert status(container) == "checkpointed - pattern=ok"
    [listed] = devices(world)
    assert listed["state"] == "suspended" and listed["paths"] == []
    assert counter(world.agent, "hotmount_gpus_reclaimed_total") == 1

    with world.agent.client(ALICE) as api:
        resumed = api.post(f"{PODS}/nb/resume", json={})
    assert resumed.status_code == 200, resumed.text
    assert resumed.json()["resumed"] == {A: A}
    assert status(container) == "running /dev/nvidia0 pattern=ok"
    [listed] = devices(world)
    assert listed["state"] == "mounted" and listed["idlePolicy"] == "suspend"


def test_a_refused_suspension_stops_nothing_and_keeps_the_gpu(old_driver: World) -> None:
    container, pid = idle_notebook(old_driver)

    wait_for(lambda: old_driver.cluster.events("GPUSuspendRefused"), "the refusal", timeout=HUNG)
    wait_passes(old_driver.agent, 2)  # and after it: nothing else is tried on the holder

    assert reasons(old_driver)[:2] == ["GPUIdleSoon", "GPUSuspendRefused"]
    assert not old_driver.cluster.events("GPUReclaimed")
    [refused] = old_driver.cluster.events("GPUSuspendRefused")
    assert refused["type"] == "Warning"
    assert "driver 550 (CUDA 12.4) or later" in refused["message"]
    assert "Nothing was stopped and the GPU stays mounted" in refused["message"]
    assert os.path.exists(f"/proc/{pid}")
    assert status(container) == "running /dev/nvidia0 pattern=ok"
    [listed] = devices(old_driver)
    assert listed["state"] == "mounted" and listed["paths"] == ["/dev/nvidia0"]
    failures = samples(old_driver.agent, "hotmount_gpu_reclaim_failures_total")
    assert any(labels.get("reason") == "refused" and value >= 1 for labels, value in failures)


def test_a_suspension_waits_for_every_gpu_of_the_container(world: World) -> None:
    container, _ = world.notebook(**IDLE)  # A busy (NVML) until B is there too
    with world.agent.client(ALICE) as api:  # B: no idle timeout, never due
        done = api.post(f"{PODS}/nb/devices", json={"devices": [B]})
    assert done.status_code == 200, done.text
    fake_nvml.write_activity(activity_file(world.cluster.workdir), [])

    wait_for(lambda: world.cluster.events("GPUReclaimSkipped"), "the skip", timeout=HUNG)

    [skipped] = world.cluster.events("GPUReclaimSkipped")
    assert "a suspension takes every GPU of the container" in skipped["message"]
    assert not world.cluster.events("GPUSuspended")
    assert status(container) == "running /dev/nvidia0 pattern=ok"
    assert sorted(d["state"] for d in devices(world)) == ["mounted", "mounted"]
