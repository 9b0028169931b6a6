"""A restarted agent rebuilds its state from the ledger and the kernel, and repairs drift."""

from __future__ import annotations

import pytest

from tests.agent.conftest import ALICE, METRICS, Cluster
from tests.support.agent import GPUS
from tests.support.waiting import wait_for

pytestmark = pytest.mark.kernel
NODE = f"/dev/nvidia{GPUS[0].minor}"


def test_agent_restart_between_mount_and_unmount(cluster: Cluster) -> None:
    container = cluster.pod("nb", mode="v2")
    first = cluster.agent(state="state")
    with first.client(ALICE) as api:
        assert (
            api.post("/v1/namespaces/default/pods/nb/devices", json={"devices": ["0"]}).status_code
            == 200
        )
    first.stop()
    # The grant outlives the agent (the v2 wrapper embeds the runtime's program).
    assert container.open_result(NODE) == "ENXIO"
    assert container.open_result("/dev/null") == "OK"
    # Drift while the agent is down: the node disappears.
    container.exec("rm", NODE)

    second = cluster.agent(state="state")
    wait_for(
        lambda: container.open_result(NODE) == "ENXIO",
        "the restarted agent's first reconcile to recreate the node",
        interval=0.2,
        show=lambda: container.open_result(NODE),
    )

    with second.client(ALICE) as api:
        status = api.get("/v1/namespaces/default/pods/nb/devices").json()
        assert [d["key"] for c in status["containers"] for d in c["devices"]] == [GPUS[0].uuid]
        unmounted = api.delete("/v1/namespaces/default/pods/nb/devices/0")
        assert unmounted.status_code == 200, unmounted.text
    with second.client(METRICS) as scraper:
        metrics = scraper.get("/metrics").text
    assert "nvidia3" not in container.ls_dev()
    assert 'hotmount_drift_repairs_total{kind="node"} 1.0' in metrics
