"""A tenant's fd flood against every way a GPU leaves (issue 40), on a real agent.

The tenant mounts GPU 0 by name (its pin keeps the kubelet's books right), then floods
its container with dup'd fds (tests/support/fd_flood.py) so that no look at the
container's open files finishes within the agent's `--fs-deadline` (short here, so a
modest flood outlasts it). Before the fix every take-back failed on that look ("cannot
take back" on every pass) while the kubelet handed the GPU to another tenant, a forced
unmount answered 504, and an idle reclaim under `unused` never happened. Now each takes
the GPU (grant revoked, node gone, ledger clear) and stops the processes the look could
not clear, saying which and why.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.agent.conftest import ALICE, DANA, Cluster
from tests.agent.test_accounting import pins_of
from tests.agent.test_holder_leaks import eventually, metric_sum
from tests.agent.test_idle_by_use import UseScene, mount_gpu0, nvml_lib  # noqa: F401
from tests.agent.test_idle_reclaim import HUNG, mounted
from tests.fakes import nvml as fake_nvml
from tests.fakes.kube_apiserver import AccessRule
from tests.support.agent import GPUS, AgentProcess
from tests.support.fd_flood import Flood, flood, per_process_limit, roomiest_nofile
from tests.support.pids import pid_exists
from tests.support.runc import RuncContainer
from tests.support.waiting import wait_for

pytestmark = pytest.mark.kernel
GPU0 = GPUS[0]
NODE = f"nvidia{GPU0.minor}"
DEADLINE = ["--fs-deadline", "0.5"]  # a look then stops at 0.25 s; the flood takes seconds
FLOOD = 80_000  # fds in all, over as many processes as this machine's limit needs
DEVICES = "/v1/namespaces/default/pods/nb/devices"


class Flooded:
    """Pod `nb` with GPU 0 mounted by name (pinned), its container flooded."""

    def __init__(self, cluster: Cluster, *extra: str) -> None:
        nofile = roomiest_nofile()
        self.cluster = cluster
        self.container: RuncContainer = cluster.pod("nb", nofile=nofile)
        self.agent: AgentProcess = cluster.agent(extra=[*DEADLINE, *extra])
        with self.agent.client(DANA) as api:
            done = api.post(DEVICES, json={"devices": ["0"]})
        assert done.status_code == 200, done.text
        assert NODE in self.container.ls_dev()
        self.flood: Flood = flood(self.container, "/dev/null", FLOOD, per_process_limit(nofile))

    def taken_back(self) -> None:
        """GPU 0 is out of the container, the ledger, and the kubelet's books' way."""
        eventually(lambda: NODE not in self.container.ls_dev(), "take the GPU back")
        assert self.container.open_result(f"/dev/{NODE}") == "ENOENT"
        with self.agent.client(DANA) as api:
            assert api.get(DEVICES).json()["containers"] == []
        for pid in self.flood.pids:
            wait_for(lambda pid=pid: not pid_exists(pid), f"flooding PID {pid} to be stopped")
        assert self.container.state()["status"] == "running"  # its init was cleared

    def names_the_flood(self, message: str) -> None:
        assert "could not finish" in message, message
        assert "budget of 0.25s" in message, message
        assert all(str(pid) in message for pid in self.flood.pids), message


@pytest.fixture
def flooded(cluster: Cluster) -> Iterator[Flooded]:
    cluster.kube.allow(AccessRule(user="dana", resource="pods", namespace="default"))
    made = Flooded(cluster, "--holder-orphan-grace", "0")
    try:
        yield made
    finally:
        made.flood.end()


def test_deleting_the_pin_of_a_flooded_container_still_loses_the_gpu(flooded: Flooded) -> None:
    """The attack: quota freed, the kubelet free to give GPU 0 to another tenant, and
    every pass logged "cannot take back"."""
    [pin] = pins_of(flooded.cluster, "nb")
    with flooded.cluster.api(DANA) as kube:
        gone = kube.delete(
            f"/api/v1/namespaces/default/pods/{pin['metadata']['name']}",
            params={"gracePeriodSeconds": 0},
        )
    assert gone.status_code == 200, gone.text

    flooded.taken_back()
    assert sorted(flooded.cluster.kube.free_devices("node-a")) == sorted(g.uuid for g in GPUS)
    eventually(lambda: flooded.cluster.events("GPUTakenBack") != [], "tell the pod")
    [told] = flooded.cluster.events("GPUTakenBack")
    assert told["involvedObject"]["name"] == "nb" and told["type"] == "Warning"
    flooded.names_the_flood(told["message"])


def test_a_forced_unmount_of_a_flooded_container_answers_200_not_504(flooded: Flooded) -> None:
    with flooded.agent.client(ALICE) as api:
        refused = api.delete(f"{DEVICES}/0")
        assert refused.status_code == 504, refused.text  # unforced: cannot tell, no change
        assert refused.json()["reason"] == "Timeout"
        assert NODE in flooded.container.ls_dev()

        forced = api.delete(f"{DEVICES}/0", params={"force": "true"})

    assert forced.status_code == 200, forced.text
    body = forced.json()
    assert len(body["unmounted"]) == 1
    assert set(flooded.flood.pids) <= set(body["unclassifiedPids"]) <= set(body["stoppedPids"])
    assert "budget of 0.25s" in body["unclassifiedWhy"]
    flooded.taken_back()
    assert pins_of(flooded.cluster, "nb") == []  # the pin goes with the mount
    [told] = flooded.cluster.events("GPUUnmounted")
    assert told["type"] == "Warning"
    flooded.names_the_flood(told["message"])


def test_a_double_booked_flooded_gpu_is_still_taken_back(flooded: Flooded) -> None:
    """The kubelet gives GPU 0 to another pod while the flooded container has it (the
    books went wrong another way: the pin is still there)."""
    flooded.cluster.pod("trainer")
    flooded.cluster.kubelets["node-a"].set_allocation(
        "default", "trainer", "main", "nvidia.com/gpu", [GPU0.uuid]
    )

    flooded.taken_back()
    wait_for(
        lambda: metric_sum(flooded.agent, "hotmount_gpu_double_bookings_taken_back_total ") == 1,
        "the take-back counted",
    )
    [told] = [
        e
        for e in flooded.cluster.events("GPUDoubleBooked")
        if e["involvedObject"]["name"] == "nb" and "could not finish" in e["message"]
    ]
    flooded.names_the_flood(told["message"])


@pytest.mark.skipif(fake_nvml.gcc() is None, reason="gcc builds the fake libnvidia-ml.so.1")
def test_an_unused_gpu_of_a_flooded_container_is_still_reclaimed(
    cluster: Cluster,
    nvml_lib: Path,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Idle by use: NVML says GPU 0 is idle; the reclaim, forced under `unused`, used to
    fail on the look at every pass and never came."""
    nofile = roomiest_nofile()
    scene = UseScene(cluster, nvml_lib, monkeypatch, nofile=nofile)
    flooding = flood(scene.container, "/dev/null", FLOOD, per_process_limit(nofile))
    try:
        agent = scene.agent(*DEADLINE)
        with agent.client(ALICE) as api:
            mount_gpu0(api, "3s")
            wait_for(lambda: cluster.events("GPUReclaimed"), "the reclaim", timeout=HUNG)
            assert not mounted(api)
        [reclaimed] = cluster.events("GPUReclaimed")
        message: Any = reclaimed["message"]
        assert f"stopped PIDs {scene.kernel_pid} that held it" in message, message
        assert all(str(pid) in message for pid in flooding.pids), message
        wait_for(lambda: not scene.kernel_alive(), "the holder's end", timeout=HUNG)
    finally:
        flooding.end()
        scene.close()
