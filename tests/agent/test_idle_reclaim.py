"""Idle reclaim on real containers: a real agent process, runc pods, the fake API server.

`nvidia.com/gpu=1` is /dev/fuse's 10:229 (tests/support/fixtures.py), so a process in
the container can hold it open. Time is counted in reconcile passes, read from the
agent's own `hotmount_reconciles_total`: passes are at least `--reconcile-interval` (1s)
apart, so a GPU released with a 3s timeout cannot go before the third pass after its
release. No test asserts on the wall clock.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from hotmount.state.ledger import Ledger
from tests.agent.conftest import ALICE, DANA, METRICS, Cluster
from tests.support.agent import GPUS, AgentProcess
from tests.support.runc import RuncContainer
from tests.support.waiting import wait_for

pytestmark = pytest.mark.kernel
FUSE_GPU = "nvidia.com/gpu=1"
DEVICES = "/v1/namespaces/default/pods/nb/devices"
HUNG = 60  # seconds: a bound on a hung agent, not a timing assertion


def samples(agent: AgentProcess, name: str) -> list[tuple[dict[str, str], float]]:
    with agent.client(METRICS) as api:
        text = api.get("/metrics").text
    return [
        (s.labels, s.value)
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name
    ]


def counter(agent: AgentProcess, name: str) -> float:
    return sum(value for _, value in samples(agent, name))


def passes(agent: AgentProcess) -> int:
    return int(counter(agent, "hotmount_reconciles_total"))


def wait_passes(agent: AgentProcess, n: int) -> int:
    """Wait until `n` more reconcile passes have finished; the count then."""
    target = passes(agent) + n + 1  # the pass under way may have counted itself already
    return wait_for(lambda: passes(agent) >= target and passes(agent), f"{n} passes", timeout=HUNG)


def mounted(api: httpx.Client) -> list[dict]:
    body = api.get(DEVICES).json()
    return [d for c in body["containers"] for d in c["devices"]]


def hold_until_stdin_closes(container: RuncContainer, path: str) -> subprocess.Popen[bytes]:
    """A process in the container holding `path` open until the test closes its stdin
    (killing `runc exec` would leave the process inside running)."""
    script = f"[ -c {path} ] && exec 3<>{path} && echo HELD && read line"
    command = ["runc", "--root", str(container.state_root), "exec", container.id]
    proc = subprocess.Popen(
        [*command, "sh", "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    assert proc.stdout is not None and b"HELD" in proc.stdout.readline()
    return proc


def ledger_clean(cluster: Cluster) -> None:
    ledger = Ledger(cluster.workdir / "state-node-a")
    assert [r.devices for r in ledger.records() if r.devices] == []
    assert ledger.claims() == []


def mount_fuse_gpu(api: httpx.Client, idle_timeout: str) -> None:
    done = api.post(DEVICES, json={"devices": [FUSE_GPU], "idleTimeout": idle_timeout})
    assert done.status_code == 200, done.text


def test_a_gpu_held_open_is_never_reclaimed_and_is_once_released(cluster: Cluster) -> None:
    container = cluster.pod("nb")
    agent = cluster.agent()
    with agent.client(ALICE) as api:
        mount_fuse_gpu(api, "3s")
        holder = hold_until_stdin_closes(container, "/dev/nvidia1")
        try:
            wait_passes(agent, 5)  # 5s and more: the timeout passed long ago

            [device] = mounted(api)
            assert device["idleTimeout"] == "3s"
            assert device["idleSeconds"] == 0
            assert container.open_result("/dev/nvidia1") == "OK"
            assert counter(agent, "hotmount_gpus_reclaimed_total") == 0
            [(labels, idle)] = samples(agent, "hotmount_gpu_idle_seconds")
            assert idle == 0 and labels["pod"] == "nb"
        finally:
            before_release = passes(agent)
            holder.communicate()  # closes stdin: the holder exits

        wait_for(lambda: cluster.events("GPUReclaimed"), "the reclaim's Event", timeout=HUNG)

        # The first pass that can see it unheld is the one under way at the release; 3s
        # of idle need three more, each at least 1s after the last.
        assert passes(agent) >= before_release + 3
        assert not mounted(api)
        [event] = cluster.events("GPUReclaimed")
        assert event["involvedObject"]["name"] == "nb"
        assert "nvidia.com/gpu=1" in event["message"] and "idle timeout 3s" in event["message"]
        assert counter(agent, "hotmount_gpus_reclaimed_total") == 1
        assert samples(agent, "hotmount_gpu_mounted_info") == []
        assert samples(agent, "hotmount_gpu_idle_seconds") == []
        holders = {d["key"]: d["holders"] for d in api.get("/v1/devices").json()["devices"]}
        assert holders[FUSE_GPU] == []
    assert container.open_result("/dev/nvidia1") in ("ENOENT", "EPERM")
    ledger_clean(cluster)


def test_an_idle_gpu_is_not_reclaimed_before_its_timeout(cluster: Cluster) -> None:
    container = cluster.pod("nb")
    agent = cluster.agent()
    with agent.client(ALICE) as api:
        mount_fuse_gpu(api, "1h")

        wait_passes(agent, 3)

        [device] = mounted(api)
        assert device["idleTimeout"] == "1h"
        assert device["idleSeconds"] >= 1  # the clock runs: nothing holds it
        [(_, idle)] = samples(agent, "hotmount_gpu_idle_seconds")
        assert idle >= 1
        assert counter(agent, "hotmount_gpus_reclaimed_total") == 0
        assert not cluster.events("GPUReclaimed")
    assert container.open_result("/dev/nvidia1") == "OK"


def test_a_gpu_without_a_timeout_stays_and_is_attributed_in_metrics(cluster: Cluster) -> None:
    cluster.pod("nb")
    agent = cluster.agent()
    with agent.client(ALICE) as api:
        done = api.post(DEVICES, json={"devices": ["0"]})
        assert done.status_code == 200, done.text

        wait_passes(agent, 3)

        [device] = mounted(api)
        assert device["idleTimeout"] is None and device["idleSeconds"] >= 1
        [(labels, value)] = samples(agent, "hotmount_gpu_mounted_info")
        assert value == 1
        assert labels == {
            "node": "node-a",
            "gpu_uuid": GPUS[0].uuid,
            "device": f"nvidia{GPUS[0].minor}",  # DCGM's `device` label
            "namespace": "default",
            "pod": "nb",
            "container": "main",
        }
        assert api.delete(f"{DEVICES}/0").status_code == 200
        assert samples(agent, "hotmount_gpu_mounted_info") == []  # the label set went too


def test_a_gpu_mounted_by_count_is_reclaimed_with_its_holder_pod(cluster: Cluster) -> None:
    cluster.pod("nb")
    agent = cluster.agent()
    with agent.client(DANA) as api:  # a namespaced tenant (hotmount-user) may ask for it
        done = api.post(DEVICES, json={"count": 1, "idleTimeout": "1s"})
        assert done.status_code == 200, done.text
        holder = done.json()["holderPod"]

        wait_for(lambda: not mounted(api), "the reclaim", timeout=HUNG)

    wait_for(
        lambda: cluster.kube.pod("default", holder) is None, "the holder's deletion", timeout=HUNG
    )
    assert sorted(cluster.kube.free_devices("node-a")) == sorted(g.uuid for g in GPUS)
    [event] = wait_for(lambda: cluster.events("GPUReclaimed"), "the Event", timeout=HUNG)
    assert "idle timeout 1s" in event["message"]
    ledger_clean(cluster)


def test_the_timeout_comes_from_the_annotation_then_the_node_default(cluster: Cluster) -> None:
    cluster.pod("nb")
    cluster.pod("annotated")
    pod = cluster.kube.pod("default", "annotated")
    pod["metadata"]["annotations"] = {"hotmount.io/idle-timeout": "2h"}
    cluster.kube.put_pod(pod)
    cluster.pod("typo")
    pod = cluster.kube.pod("default", "typo")
    pod["metadata"]["annotations"] = {"hotmount.io/idle-timeout": "20"}
    cluster.kube.put_pod(pod)
    agent = cluster.agent(extra=["--idle-timeout", "45m"])
    with agent.client(ALICE) as api:
        assert api.post(DEVICES, json={"devices": ["0"]}).status_code == 200
        annotated = "/v1/namespaces/default/pods/annotated/devices"
        assert api.post(annotated, json={"devices": ["1"]}).status_code == 200
        refused = api.post("/v1/namespaces/default/pods/typo/devices", json={"devices": [FUSE_GPU]})
        bad = api.post(DEVICES, json={"devices": [FUSE_GPU], "idleTimeout": "soon"})

        assert [d["idleTimeout"] for d in mounted(api)] == ["45m"]
        [device] = [d for c in api.get(annotated).json()["containers"] for d in c["devices"]]
        assert device["idleTimeout"] == "2h"
        assert refused.status_code == 400, refused.text
        assert (
            "pod annotation hotmount.io/idle-timeout: '20' is not a duration"
            in (refused.json()["message"])
        )
        assert bad.status_code == 422 and "not a duration" in bad.json()["message"]
        typo = api.get("/v1/namespaces/default/pods/typo/devices").json()
        assert typo["containers"] == []  # nothing mounted


def test_a_restarted_agent_keeps_the_idle_clock(cluster: Cluster, tmp_path: Path) -> None:
    """The clock is kept beside the ledger (issue 20): a GPU idle before a restart is
    still idle since then, not since the restart."""
    cluster.pod("nb")
    agent = cluster.agent()
    with agent.client(ALICE) as api:
        assert (
            api.post(DEVICES, json={"devices": [FUSE_GPU], "idleTimeout": "1h"}).status_code == 200
        )
        wait_for(lambda: (mounted(api)[0]["idleSeconds"] or 0) >= 3, "3s of idle", timeout=HUNG)
    agent.stop()
    again = cluster.agent()
    with again.client(ALICE) as api:
        [device] = mounted(api)
        assert device["idleSeconds"] >= 3
        assert device["idleTimeout"] == "1h"  # the timeout lives in the ledger


RDMA_CDI_SPEC = """\
cdiVersion: 0.6.0
kind: example.com/rdma
devices:
  - name: hca
    containerEdits:
      deviceNodes:
        - {path: /dev/infiniband/uverbs9, type: c, major: 231, minor: 201}
"""


def pod_and_agent_with_cdi(
    cluster: Cluster, tmp_path: Path, spec: str
) -> tuple[RuncContainer, AgentProcess]:
    """A pod `nb`, and an agent that also reads `spec` from a CDI directory of its own."""
    specs = tmp_path / "cdi-extra"
    specs.mkdir()
    (specs / "spec.yaml").write_text(spec)
    container = cluster.pod("nb")
    return container, cluster.agent(extra=["--cdi-dir", str(specs)])


def test_a_cdi_declared_rdma_device_is_neither_reclaimed_nor_counted_as_a_gpu(
    cluster: Cluster, tmp_path: Path
) -> None:
    """A vendor-neutral CDI spec declares an RDMA device (kind `cdi`, a verbs node). Mounted
    with a GPU under one idle timeout, only the GPU is a GPU: it alone is reclaimed and
    exported in hotmount_gpu_mounted_info; the NIC stays until it is named."""
    container, agent = pod_and_agent_with_cdi(cluster, tmp_path, RDMA_CDI_SPEC)
    with agent.client(ALICE) as api:
        body = {"devices": ["0", "example.com/rdma=hca"], "idleTimeout": "1s"}
        done = api.post(DEVICES, json=body)
        assert done.status_code == 200, done.text
        [(labels, _)] = samples(agent, "hotmount_gpu_mounted_info")
        assert labels["gpu_uuid"] == GPUS[0].uuid

        wait_for(lambda: cluster.events("GPUReclaimed"), "the GPU's reclaim", timeout=HUNG)
        wait_passes(agent, 3)  # passes enough to have taken the NIC, were it a GPU

        assert [d["key"] for d in mounted(api)] == ["example.com/rdma=hca"]
        assert "uverbs9" in container.exec("ls", "/dev/infiniband").stdout.split()
        assert counter(agent, "hotmount_gpus_reclaimed_total") == 1
        assert samples(agent, "hotmount_gpu_mounted_info") == []
        assert samples(agent, "hotmount_gpu_idle_seconds") == []
        [event] = cluster.events("GPUReclaimed")
        assert "uverbs" not in event["message"] and "rdma" not in event["message"]


UVM_CDI_SPEC = """\
cdiVersion: 0.6.0
kind: example.com/gpu
devices:
  - name: g7
    containerEdits:
      deviceNodes:
        - {path: /dev/nvidia7, type: c, major: 195, minor: 7}
containerEdits:
  deviceNodes:
    - {path: /dev/nvidia-uvm, type: c, major: 1, minor: 5}
"""


def test_a_gpu_the_engine_finds_busy_at_reclaim_is_kept_and_its_clock_restarts(
    cluster: Cluster, tmp_path: Path
) -> None:
    """The reconciler's look (the GPU's own nodes) finds it idle, but at the unmount the
    engine finds a holder: a process holds /dev/nvidia-uvm, a shared node that leaves
    with the last GPU (here /dev/zero's 1:5, so it opens). It stands for a process that
    opened the GPU between the look and the unmount: DeviceBusy. The reclaim takes
    nothing, restarts the clock, and tries again on a later pass, never by force."""
    container, agent = pod_and_agent_with_cdi(cluster, tmp_path, UVM_CDI_SPEC)
    with agent.client(ALICE) as api:
        done = api.post(DEVICES, json={"devices": ["example.com/gpu=g7"], "idleTimeout": "1s"})
        assert done.status_code == 200, done.text
        holder = hold_until_stdin_closes(container, "/dev/nvidia-uvm")
        try:
            tries = "reclaim of example.com/gpu=g7 from"
            wait_for(
                lambda: agent.log.read_text().count(tries) >= 2,
                "two reclaims found busy",
                timeout=HUNG,
            )

            assert "in use, its idle clock restarts" in agent.log.read_text()
            assert [d["key"] for d in mounted(api)] == ["example.com/gpu=g7"]
            assert {"nvidia7", "nvidia-uvm"} <= set(container.ls_dev())
            assert counter(agent, "hotmount_gpus_reclaimed_total") == 0
            assert not cluster.events("GPUReclaimed")
            assert holder.poll() is None, "the holder was not stopped (no force)"
        finally:
            holder.communicate()

        wait_for(
            lambda: cluster.events("GPUReclaimed"),
            "the reclaim once nothing holds it",
            timeout=HUNG,
        )
        assert not mounted(api)
    ledger_clean(cluster)


def test_warn_before_sets_the_warnings_lead_and_bad_values_mount_nothing(
    cluster: Cluster,
) -> None:
    """Without warnBefore a 6s timeout warns at once (the lead is the whole timeout, as the
    lead's minute is longer); with warnBefore 2s the warning says 2s are left."""
    cluster.pod("nb")
    agent = cluster.agent()
    with agent.client(ALICE) as api:
        for body, message in (
            ({"idleTimeout": "6s", "warnBefore": "6s"}, "must be shorter than the idle timeout"),
            ({"warnBefore": "2s"}, "needs an idle timeout"),
        ):
            refused = api.post(DEVICES, json={"devices": [FUSE_GPU], **body})
            assert refused.status_code == 400, refused.text
            assert message in refused.json()["message"]
        assert mounted(api) == []
        ledger_clean(cluster)

        done = api.post(
            DEVICES, json={"devices": [FUSE_GPU], "idleTimeout": "6s", "warnBefore": "2s"}
        )
        assert done.status_code == 200, done.text
        wait_for(lambda: cluster.events("GPUIdleSoon"), "the warning", timeout=HUNG)
        [soon] = cluster.events("GPUIdleSoon")
        assert "reclaimed in 2s unless used" in soon["message"], soon["message"]
        wait_for(lambda: cluster.events("GPUReclaimed"), "the reclaim", timeout=HUNG)
        assert mounted(api) == []
