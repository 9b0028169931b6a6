"""Idle by use (issue 20) on real runc containers: a real agent process that loads the
fake libnvidia-ml.so.1 (tests/fakes/nvml), whose utilization the test writes.

GPU 0 (fixture, 195:3) is hot-mounted; a `sleep` in the container is listed by the fake
NVML as a compute process on it: a notebook kernel that ran one CUDA cell and holds the
GPU. Time is counted in reconcile passes (`hotmount_reconciles_total`, at least
`--reconcile-interval` 1s apart) and by waiting for what the agent reports (Events, the
listing), never by asserting on the wall clock.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.agent.conftest import ALICE, Cluster
from tests.agent.test_idle_reclaim import (
    DEVICES,
    HUNG,
    counter,
    mounted,
    passes,
    samples,
    wait_passes,
)
from tests.fakes import nvml as fake_nvml
from tests.fakes.nvml import FakeActivity, FakeGpu
from tests.support.agent import GPUS, AgentProcess
from tests.support.waiting import wait_for

pytestmark = [
    pytest.mark.kernel,
    pytest.mark.skipif(fake_nvml.gcc() is None, reason="gcc builds the fake libnvidia-ml.so.1"),
]
GPU0 = GPUS[0]


@pytest.fixture(scope="module")
def nvml_lib(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return fake_nvml.build(tmp_path_factory.mktemp("fake-nvml"))


class UseScene:
    """A pod `nb` with a CUDA-ish holder of GPU 0 (by NVML), and the activity file."""

    def __init__(
        self,
        cluster: Cluster,
        nvml_lib: Path,
        monkeypatch: pytest.MonkeyPatch,
        nofile: int | None = None,
    ):
        self.cluster = cluster
        self.container = cluster.pod("nb", nofile=nofile)
        self.kernel = self.container.exec_in_background("sleep", "1000")
        try:
            self.kernel_pid = wait_for(self._kernel_pid, "the holder's host PID", timeout=HUNG)
        except BaseException:
            self.close()
            raise
        config = fake_nvml.write_config(
            cluster.workdir / "nvml-gpus",
            [
                FakeGpu(GPU0.uuid, GPU0.bus_id, GPU0.minor, compute_pids=(self.kernel_pid,)),
                FakeGpu(GPUS[1].uuid, GPUS[1].bus_id, GPUS[1].minor),
            ],
        )
        self.activity = cluster.workdir / "nvml-activity"
        self.set_activity()
        for name, value in fake_nvml.with_activity(
            fake_nvml.env(nvml_lib, config, base={}), self.activity
        ).items():
            monkeypatch.setenv(name, value)  # the agent process' environment

    def _kernel_pid(self) -> int | None:
        procs = (self.container.v1_devices_dir / "cgroup.procs").read_text().split()
        others = [int(p) for p in procs if int(p) != self.container.pid]
        return others[0] if others else None

    def set_activity(self, *activity: FakeActivity) -> None:
        fake_nvml.write_activity(self.activity, activity)

    def agent(self, *extra: str) -> AgentProcess:
        return self.cluster.agent(extra=["--use-nvml", "--idle-policy", "unused", *extra])

    def kernel_alive(self) -> bool:
        return os.path.exists(f"/proc/{self.kernel_pid}")

    def close(self) -> None:
        self.kernel.kill()
        self.kernel.wait()


@pytest.fixture
def scene(cluster: Cluster, nvml_lib: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[UseScene]:
    made = UseScene(cluster, nvml_lib, monkeypatch)
    try:
        yield made
    finally:
        made.close()


def mount_gpu0(api, timeout: str, **extra: object) -> None:  # type: ignore[no-untyped-def]
    done = api.post(DEVICES, json={"devices": ["0"], "idleTimeout": timeout, **extra})
    assert done.status_code == 200, done.text


def test_a_held_but_unused_gpu_is_warned_then_reclaimed_and_its_holder_stopped(
    scene: UseScene,
) -> None:
    agent = scene.agent()
    with agent.client(ALICE) as api:
        mount_gpu0(api, "3s")
        [device] = mounted(api)
        assert device["idlePolicy"] == "unused"

        wait_for(lambda: scene.cluster.events("GPUReclaimed"), "the reclaim", timeout=HUNG)

        assert not mounted(api)
    reasons = [
        e["reason"]
        for e in scene.cluster.kube.events()
        if e.get("reason") in ("GPUIdleSoon", "GPUReclaimed")
    ]
    assert reasons == ["GPUIdleSoon", "GPUReclaimed"]  # the warning first, once
    [soon] = scene.cluster.events("GPUIdleSoon")
    assert soon["type"] == "Warning"
    assert "unless used" in soon["message"] and "policy unused" in soon["message"]
    [reclaimed] = scene.cluster.events("GPUReclaimed")
    assert f"stopped PIDs {scene.kernel_pid}" in reclaimed["message"]
    wait_for(lambda: not scene.kernel_alive(), "the holder's end", timeout=HUNG)
    assert counter(agent, "hotmount_gpu_idle_warnings_total") == 1
    assert counter(agent, "hotmount_gpus_reclaimed_total") == 1


def test_a_used_gpu_is_never_reclaimed_and_its_use_is_exported(scene: UseScene) -> None:
    scene.set_activity(FakeActivity(GPU0.uuid, gpu=40, memory=3))
    agent = scene.agent()
    with agent.client(ALICE) as api:
        mount_gpu0(api, "3s")

        wait_passes(agent, 5)  # 5s and more: a 3s timeout passed long ago

        [device] = mounted(api)
        assert device["idleSeconds"] == 0 and device["reclaimInSeconds"] is None
        [(labels, value)] = samples(agent, "hotmount_gpu_utilization_ratio")
        assert value == pytest.approx(0.4)
        assert labels == {
            "node": "node-a", "gpu_uuid": GPU0.uuid, "namespace": "default", "pod": "nb",
        }  # fmt: skip
    assert scene.kernel_alive()
    assert not scene.cluster.events("GPUIdleSoon") and not scene.cluster.events("GPUReclaimed")


def test_activity_resets_the_clock(scene: UseScene) -> None:
    agent = scene.agent()
    with agent.client(ALICE) as api:
        mount_gpu0(api, "1h")
        wait_for(lambda: (mounted(api)[0]["idleSeconds"] or 0) >= 2, "2s idle", timeout=HUNG)

        # Its own process computes (a per-process sample, the device-wide rate at 0).
        scene.set_activity(FakeActivity(GPU0.uuid, processes=((scene.kernel_pid, 25, 0),)))
        wait_passes(agent, 2)
        assert mounted(api)[0]["idleSeconds"] == 0

        scene.set_activity()
        wait_passes(agent, 2)
        [device] = mounted(api)
        assert 0 < device["idleSeconds"] < 1000  # a new clock, not the old one resumed


def test_unheld_is_unchanged_and_a_gpu_nvml_cannot_sample_falls_back_to_it(
    scene: UseScene,
) -> None:
    """Under `unheld`, NVML's process list holds GPU 0 however idle it is. GPU 1 asks for
    `unused`, but NVML cannot sample it (as for a MIG instance): it is judged by holders,
    says so, and, with none, is reclaimed as before, without stopping anything."""
    scene.set_activity(FakeActivity(GPUS[1].uuid, unsupported=True))
    agent = scene.agent()
    with agent.client(ALICE) as api:
        mount_gpu0(api, "2s", idlePolicy="unheld")
        done = api.post(DEVICES, json={"devices": ["1"], "idleTimeout": "2s"})
        assert done.status_code == 200, done.text

        wait_for(lambda: scene.cluster.events("GPUReclaimed"), "GPU 1's reclaim", timeout=HUNG)
        wait_passes(agent, 3)

        [device] = mounted(api)
        assert device["uuid"] == GPU0.uuid and device["idlePolicy"] == "unheld"
        assert device["idleSeconds"] == 0
    [event] = scene.cluster.events("GPUReclaimed")
    assert "stopped" not in event["message"]
    assert "cannot sample" in agent.log.read_text()
    assert scene.kernel_alive()


def test_an_agent_restart_never_shortens_the_clock(scene: UseScene) -> None:
    agent = scene.agent()
    with agent.client(ALICE) as api:
        mount_gpu0(api, "1h")
        wait_for(lambda: (mounted(api)[0]["idleSeconds"] or 0) >= 3, "3s of idle", timeout=HUNG)
    agent.stop()
    again = scene.agent()
    with again.client(ALICE) as api:
        [device] = mounted(api)
        assert device["idleSeconds"] >= 3  # read from the kept clock before any pass
        first = passes(again)
        wait_passes(again, 1)
        assert mounted(api)[0]["idleSeconds"] >= 3 and passes(again) > first
