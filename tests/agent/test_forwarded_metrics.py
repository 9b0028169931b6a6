"""A call forwarded to the pod's node is counted once on each agent: as `forwarded` on
the agent it was sent to (never as an error or a refusal, which the chart's dashboard
and alerts read), and as its real result on the agent that did it. Two real agent
processes, a real runc container on node-b, the fake API server."""

from __future__ import annotations

import pytest

from tests.agent.conftest import ALICE, METRICS, Cluster
from tests.agent.test_monitoring_metrics import samples
from tests.support.agent import AgentProcess

pytestmark = pytest.mark.kernel
OPERATIONS, REFUSED = "hotmount_operations_total", "hotmount_operations_refused_total"


def counted(agent: AgentProcess, name: str) -> dict[tuple[str, str], float]:
    """`name`'s samples as {(operation, result or reason): value}."""
    with agent.client(METRICS) as scraper:
        scraped = scraper.get("/metrics")
    assert scraped.status_code == 200, scraped.text
    found = samples(scraped.text, name)
    return {tuple(v for _, v in labels): value for labels, value in found.items()}  # type: ignore[misc]


def test_a_forwarded_mount_is_counted_as_forwarded_not_as_an_error(cluster: Cluster) -> None:
    cluster.pod("nb", node="node-b")
    node_a, node_b = cluster.agent("node-a"), cluster.agent("node-b")
    with node_a.client(ALICE) as api:
        mounted = api.post("/v1/namespaces/default/pods/nb/devices", json={"devices": ["0"]})
        assert mounted.status_code == 200, mounted.text
        unmounted = api.delete("/v1/namespaces/default/pods/nb/devices/0")
        assert unmounted.status_code == 200, unmounted.text
        ghost = api.post("/v1/namespaces/default/pods/ghost/devices", json={"devices": ["0"]})
        assert ghost.status_code == 404, ghost.text

    # node-a: one forwarded mount and unmount; the ghost is its own refusal, nothing else
    assert counted(node_a, OPERATIONS) == {
        ("mount", "forwarded"): 1.0,
        ("unmount", "forwarded"): 1.0,
        ("mount", "error"): 1.0,
    }
    assert counted(node_a, REFUSED) == {("mount", "PodNotFound"): 1.0}
    # node-b: the mount and the unmount it did, each a success
    assert counted(node_b, OPERATIONS) == {("mount", "success"): 1.0, ("unmount", "success"): 1.0}
    assert counted(node_b, REFUSED) == {}
