"""/healthz follows the reconcile loop (issue 29, item 3c).

A reconcile thread that never comes back stops idle reclaim, take-backs, remounts and
orphan cleanup while every route still answers. Here it is stopped for real: the test
process takes the ledger lock of the mounted container (as a call stuck on it would),
so the agent's pass waits on flock with no bounded child to show progress.
"""

from __future__ import annotations

import re

import httpx
import pytest

from hotmount.state.ledger import Ledger
from tests.agent.conftest import ALICE, METRICS, Cluster
from tests.agent.test_idle_reclaim import HUNG, mount_fuse_gpu, wait_passes
from tests.support.agent import GPUS
from tests.support.hung_fuse import HungFuse, hold_file
from tests.support.waiting import wait_for

pytestmark = pytest.mark.kernel


def _health(url: str) -> int:
    with httpx.Client(base_url=url, timeout=10) as probe:
        return probe.get("/healthz").status_code


def _last_success(agent) -> float:  # type: ignore[no-untyped-def]
    with agent.client(METRICS) as scraper:
        text = scraper.get("/metrics").text
    found = re.search(r"^hotmount_reconcile_last_success_timestamp_seconds (\S+)$", text, re.M)
    assert found, "the gauge is exported"
    return float(found.group(1))


def test_healthz_fails_while_reconcile_is_stuck_and_recovers_after(cluster: Cluster) -> None:
    cluster.pod("nb", mode="v2")
    extra = ["--reconcile-stall-intervals", "3", "--fs-deadline", "1"]  # 3 s without progress
    agent = cluster.agent(state="state", extra=extra)
    with agent.client(ALICE) as api:
        mounted = api.post("/v1/namespaces/default/pods/nb/devices", json={"devices": ["0"]})
        assert mounted.status_code == 200, mounted.text
    wait_for(lambda: _last_success(agent) > 0, "a reconcile pass to finish")
    assert _health(agent.url) == 200

    ledger = Ledger(cluster.workdir / "state")
    (record,) = ledger.records()
    with ledger.lock(record.key):  # the next pass waits here, for ever as far as it knows
        wait_for(lambda: _health(agent.url) == 503, "/healthz to fail", timeout=60)
        with httpx.Client(base_url=agent.url, timeout=10) as probe:
            failed = probe.get("/healthz")
            assert "no progress" in failed.text
            assert probe.get("/readyz").status_code == 200  # still serving: only liveness
        stuck_at = _last_success(agent)
    wait_for(lambda: _health(agent.url) == 200, "/healthz to recover once the pass goes on")
    wait_for(lambda: _last_success(agent) > stuck_at, "the gauge to move again")


def test_a_pod_holding_a_file_on_a_hung_filesystem_does_not_stop_reclaim_elsewhere(
    cluster: Cluster,
) -> None:
    """Item 3: pod `hung` holds a file on a dev-capable FUSE mount whose server stopped.
    Its GPU cannot be judged (kept: held, not idle); pod `nb`'s idle GPU is still
    reclaimed, and the agent stays live."""
    hung = cluster.pod("hung")
    cluster.pod("nb")
    agent = cluster.agent(extra=["--fs-deadline", "1"])
    fuse = HungFuse()
    holder = None
    try:
        with agent.client(ALICE) as api:
            kept = api.post(
                "/v1/namespaces/default/pods/hung/devices",
                json={"devices": ["0"], "idleTimeout": "3s"},
            )
            assert kept.status_code == 200, kept.text
            fuse.mount_in(hung.pid, "/mnt/hung")
            holder = hold_file(hung, "/mnt/hung/file")
            fuse.hang()
            mount_fuse_gpu(api, "3s")  # pod nb, held by nobody

            wait_for(lambda: cluster.events("GPUReclaimed"), "nb's reclaim", timeout=HUNG)

            [event] = cluster.events("GPUReclaimed")
            assert event["involvedObject"]["name"] == "nb"
            wait_passes(agent, 3)
            listed = api.get("/v1/namespaces/default/pods/hung/devices").json()
            assert [d["key"] for c in listed["containers"] for d in c["devices"]] == [GPUS[0].uuid]
        assert _health(agent.url) == 200
    finally:
        fuse.close()
        if holder is not None:
            holder.kill()
            holder.communicate()
