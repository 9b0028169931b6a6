"""Idle reclaim of one GPU of a pod that trains on another (issue 29, item 1), on real
runc containers, a real agent process and the fake libnvidia-ml.so.1 (tests/fakes/nvml).

Pod `nb` holds GPU 0 (fixture minor 3) and GPU 1 (minor 1). Their own nodes are
stand-ins no driver answers, so which GPU a process uses is told by NVML (each process'
compute context, as on a real node). Every CUDA process also holds /dev/nvidia-uvm, the
shared node that leaves only with the container's last GPU: here the agent's
/proc/devices gives the nvidia-uvm major to the cpuid driver, so /dev/nvidia-uvm is
/dev/cpu/0/cpuid's 203:0 and really opens. Time is counted in reconcile passes and
Events, never on the wall clock.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.agent.conftest import ALICE, Cluster
from tests.agent.test_idle_reclaim import DEVICES, HUNG, mounted, samples, wait_passes
from tests.fakes import nvml as fake_nvml
from tests.fakes.nvml import FakeActivity, FakeGpu
from tests.support.agent import GPUS, AgentProcess
from tests.support.runc import RuncContainer
from tests.support.waiting import wait_for

CPUID = Path("/dev/cpu/0/cpuid")
pytestmark = [
    pytest.mark.kernel,
    pytest.mark.skipif(fake_nvml.gcc() is None, reason="gcc builds the fake libnvidia-ml.so.1"),
    pytest.mark.skipif(
        not CPUID.exists(), reason="the cpuid driver's /dev/cpu/0/cpuid stands in for nvidia-uvm"
    ),
]
GPU0, GPU1 = GPUS


@pytest.fixture(scope="module")
def nvml_lib(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return fake_nvml.build(tmp_path_factory.mktemp("fake-nvml"))


class CudaProcess:
    """A process in the container that, once told, holds /dev/nvidia-uvm open, as a CUDA
    process does; the GPUs it computes on are what the fake NVML says of its host PID."""

    def __init__(self, container: RuncContainer) -> None:
        script = "echo $$ && read go && exec 3<>/dev/nvidia-uvm && echo HELD && exec sleep 100000"
        command = ["runc", "--root", str(container.state_root), "exec", container.id]
        self.runc = subprocess.Popen(
            [*command, "sh", "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE
        )
        assert self.runc.stdout is not None
        inner = int(self.runc.stdout.readline())
        self.pid = wait_for(lambda: _host_pid(container, inner), "its host PID", timeout=HUNG)

    def hold_uvm(self) -> None:
        assert self.runc.stdin is not None and self.runc.stdout is not None
        self.runc.stdin.write(b"go\n")
        self.runc.stdin.flush()
        assert b"HELD" in self.runc.stdout.readline()

    def alive(self) -> bool:
        return self.runc.poll() is None  # `runc exec` lives exactly as long as it does

    def close(self) -> None:
        self.runc.kill()
        self.runc.communicate()


def _host_pid(container: RuncContainer, inner: int) -> int | None:
    """The host PID of the container's process `inner` (the last NSpid is the innermost)."""
    for pid in (container.v1_devices_dir / "cgroup.procs").read_text().split():
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        nspid = next(line for line in status.splitlines() if line.startswith("NSpid:"))
        if int(nspid.split()[-1]) == inner:
            return int(pid)
    return None


class Scene:
    """Pod `nb`, its CUDA processes, the fake NVML's GPUs (whose processes are known only
    once those processes run) and activity file, and an agent that loads them."""

    def __init__(self, cluster: Cluster, nvml_lib: Path) -> None:
        self.cluster, self.nvml_lib = cluster, nvml_lib
        self.container = cluster.pod("nb")
        self.processes: list[CudaProcess] = []
        self.activity = cluster.workdir / "nvml-activity"
        fake_nvml.write_activity(self.activity, [FakeActivity(GPU1.uuid, gpu=60, memory=20)])

    def process(self) -> CudaProcess:
        self.processes.append(CudaProcess(self.container))
        return self.processes[-1]

    def agent(self, on_gpu0: list[CudaProcess], on_gpu1: list[CudaProcess]) -> AgentProcess:
        config = fake_nvml.write_config(
            self.cluster.workdir / "nvml-gpus",
            [
                FakeGpu(GPU0.uuid, GPU0.bus_id, GPU0.minor, tuple(p.pid for p in on_gpu0)),
                FakeGpu(GPU1.uuid, GPU1.bus_id, GPU1.minor, tuple(p.pid for p in on_gpu1)),
            ],
        )
        proc_devices = self.cluster.workdir / "proc-devices"
        uvm_major = os.major(CPUID.stat().st_rdev)
        proc_devices.write_text(
            Path("/proc/devices")
            .read_text()
            .replace("Character devices:\n", f"Character devices:\n{uvm_major} nvidia-uvm\n", 1)
        )
        env = fake_nvml.with_activity(fake_nvml.env(self.nvml_lib, config, base={}), self.activity)
        return self.cluster.agent(extra=["--use-nvml"], env=env, proc_devices=proc_devices)

    def mount_both(self, api: httpx.Client, **gpu0: str) -> None:
        """GPU 0 with `gpu0`'s idle settings, GPU 1 with none; then every process holds
        /dev/nvidia-uvm, which came with them."""
        done = api.post(DEVICES, json={"devices": ["0"], **gpu0})
        assert done.status_code == 200, done.text
        done = api.post(DEVICES, json={"devices": ["1"]})
        assert done.status_code == 200, done.text
        for process in self.processes:
            process.hold_uvm()

    def close(self) -> None:
        for process in self.processes:
            process.close()


@pytest.fixture
def scene(cluster: Cluster, nvml_lib: Path) -> Iterator[Scene]:
    made = Scene(cluster, nvml_lib)
    try:
        yield made
    finally:
        made.close()


def mounted_uuids(api: httpx.Client) -> list[str]:
    return [d["uuid"] for d in mounted(api)]


@pytest.mark.parametrize("policy", ["unheld", "unused"])
def test_an_idle_gpu_is_reclaimed_while_a_process_trains_on_the_other(
    scene: Scene, policy: str
) -> None:
    """The trainer computes on GPU 1 and holds /dev/nvidia-uvm, which stays with GPU 1: it
    neither holds GPU 0 (under `unheld`, GPU 0 was never reclaimed) nor is it stopped
    (under `unused`, it was SIGKILLed)."""
    trainer = scene.process()
    agent = scene.agent(on_gpu0=[], on_gpu1=[trainer])
    with agent.client(ALICE) as api:
        scene.mount_both(api, idleTimeout="2s", idlePolicy=policy)

        [event] = wait_for(
            lambda: scene.cluster.events("GPUReclaimed"), "GPU 0's reclaim", timeout=HUNG
        )

        assert mounted_uuids(api) == [GPU1.uuid]
        assert "stopped" not in event["message"]
        assert trainer.alive()
        assert scene.container.open_result("/dev/nvidia-uvm") == "OK"


def test_unused_reclaim_stops_the_leaving_gpus_process_and_no_other(scene: Scene) -> None:
    idler, trainer = scene.process(), scene.process()
    agent = scene.agent(on_gpu0=[idler], on_gpu1=[trainer])
    with agent.client(ALICE) as api:
        scene.mount_both(api, idleTimeout="2s", idlePolicy="unused")

        [event] = wait_for(
            lambda: scene.cluster.events("GPUReclaimed"), "GPU 0's reclaim", timeout=HUNG
        )

        assert f"stopped PIDs {idler.pid} that held it" in event["message"]
        wait_for(lambda: not idler.alive(), "the end of GPU 0's process", timeout=HUNG)
        assert trainer.alive()
        assert mounted_uuids(api) == [GPU1.uuid]


def test_a_process_on_both_gpus_is_never_stopped_and_the_reclaim_says_why(
    scene: Scene,
) -> None:
    both = scene.process()
    agent = scene.agent(on_gpu0=[both], on_gpu1=[both])
    with agent.client(ALICE) as api:
        scene.mount_both(api, idleTimeout="2s", idlePolicy="unused")

        [skipped, *_] = wait_for(
            lambda: scene.cluster.events("GPUReclaimSkipped"), "the skip's Event", timeout=HUNG
        )
        wait_passes(agent, 2)

        assert skipped["type"] == "Warning"
        assert f"PID {both.pid}" in skipped["message"]
        assert "(staying)" in skipped["message"] and "clock starts again" in skipped["message"]
        assert both.alive()
        assert sorted(mounted_uuids(api)) == sorted([GPU0.uuid, GPU1.uuid])
        assert not scene.cluster.events("GPUReclaimed")
        # Counted as a reclaim not made, `skipped` (not the alerted `error`): issue 34.
        failures = {
            labels["reason"]: value
            for labels, value in samples(agent, "hotmount_gpu_reclaim_failures_total")
        }
        assert failures.get("skipped", 0) >= 1 and failures.get("error", 0) == 0, failures


def test_a_plain_unmount_of_one_gpu_passes_a_process_on_the_other(scene: Scene) -> None:
    trainer = scene.process()
    agent = scene.agent(on_gpu0=[], on_gpu1=[trainer])
    with agent.client(ALICE) as api:
        scene.mount_both(api)

        done = api.delete(f"{DEVICES}/0")

        assert done.status_code == 200, done.text
        assert mounted_uuids(api) == [GPU1.uuid]
        assert trainer.alive()
