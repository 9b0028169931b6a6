"""A list across the cluster names every node it could not list, and says why.

Two real agents (node-a, node-b) and, registered as agent pods in the fake API server,
stand-ins that fail as real agents do: refused (nothing listens), 503, a body that is
no list, silence (accepts, never answers), a Pending agent pod; and GPU nodes with no
agent pod at all. node-a fans out; its answer lists node-a and node-b and names the rest
in `metadata.missingNodes` (docs/api.md), as JSON, as a kubectl Table and in Warning
headers.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.agent.conftest import ALICE, Cluster
from tests.fakes.agent_peers import AnsweringPeer, HangingPeer, refused_port
from tests.fakes.kube_apiserver import AccessRule
from tests.support.agent import AgentProcess, agent_pod_manifest

pytestmark = pytest.mark.kernel
AGG = "/apis/hotmount.io/v1alpha1"
TABLE = "application/json;as=Table;v=v1;g=meta.k8s.io, application/json"
EXPECTED = {
    "node-refused": "Refused",
    "node-503": "ServerError",
    "node-garbled": "BadAnswer",
    "node-silent": "Timeout",
    "node-pending": "NoAgent",
    "node-gpus-only": "NoAgent",
    "node-labelled": "NoAgent",
}


def peer_pod(node: str, port: int, phase: str = "Running") -> dict[str, Any]:
    pod = agent_pod_manifest(node, port)
    if phase != "Running":
        pod["status"] = {"phase": phase}
    return pod


@pytest.fixture
def broken(cluster: Cluster) -> Iterator[dict[str, Any]]:
    peers = {
        "node-503": AnsweringPeer(503, b'{"kind":"Status","message":"not ready"}'),
        "node-garbled": AnsweringPeer(200, b'{"kind":"NodeDevices"}'),
    }
    silent = HangingPeer()
    for node, peer in peers.items():
        cluster.kube.put_pod(peer_pod(node, peer.port))
    cluster.kube.put_pod(peer_pod("node-silent", silent.port))
    cluster.kube.put_pod(peer_pod("node-refused", refused_port()))
    cluster.kube.put_pod(peer_pod("node-pending", 1, phase="Pending"))
    cluster.kube.put_node("node-gpus-only", gpus=8)
    cluster.kube.put_node("node-labelled", labels={"nvidia.com/gpu.present": "true"})
    cluster.kube.put_node("node-cpu-only")  # no GPUs, no agent: not missing from anything
    try:
        yield peers
    finally:
        for peer in peers.values():
            peer.stop()
        silent.stop()


def start_agents(cluster: Cluster) -> AgentProcess:
    quiet = ["--authz-cache-ttl", "60", "--reconcile-interval", "3600"]
    # Long enough for node-b, a real agent, to answer on a loaded machine; node-silent
    # costs this much per list.
    node_a = cluster.agent("node-a", extra=[*quiet, "--list-timeout", "5"])
    cluster.agent("node-b", extra=quiet)
    return node_a


def missing_of(answer: Any) -> dict[str, str]:
    return {m["node"]: m["reason"] for m in answer.json()["metadata"]["missingNodes"]}


def test_every_node_that_did_not_answer_is_named_with_its_reason(
    cluster: Cluster, broken: dict[str, Any]
) -> None:
    node_a = start_agents(cluster)
    with node_a.client(ALICE) as api:
        listed = api.get(f"{AGG}/nodedevices")
        assert listed.status_code == 200, listed.text
        assert sorted(i["metadata"]["name"] for i in listed.json()["items"]) == ["node-a", "node-b"]
        assert missing_of(listed) == EXPECTED
        by_node = {m["node"]: m["message"] for m in listed.json()["metadata"]["missingNodes"]}
        assert "not ready" in by_node["node-503"]
        assert "Pending" in by_node["node-pending"]
        warnings = listed.headers.get_list("warning")
        assert len(warnings) == len(EXPECTED)
        assert any(
            w.startswith('299 - "node node-silent did not answer (Timeout)') for w in warnings
        )

        table = api.get(f"{AGG}/nodedevices", headers={"accept": TABLE})
        assert table.status_code == 200, table.text
        assert table.json()["kind"] == "Table"
        assert {r["cells"][0] for r in table.json()["rows"]} == {"node-a", "node-b"}
        assert missing_of(table) == EXPECTED

        mounts = api.get(f"{AGG}/namespaces/default/gpumounts")
        assert mounts.status_code == 200, mounts.text
        assert missing_of(mounts) == EXPECTED


def test_a_list_where_every_node_answered_has_no_missing_nodes(cluster: Cluster) -> None:
    node_a = start_agents(cluster)
    with node_a.client(ALICE) as api:
        listed = api.get(f"{AGG}/nodedevices")
    assert listed.status_code == 200, listed.text
    assert "missingNodes" not in listed.json()["metadata"]
    assert not listed.headers.get_list("warning")


def test_one_node_is_asked_of_that_node_alone(cluster: Cluster, broken: dict[str, Any]) -> None:
    """`nvcli list --node N`: a get of N's NodeDevices goes to N's agent, no fan-out."""
    cluster.kube.allow(
        AccessRule(group="ml", api_group="hotmount.io", resource="nodedevices", verb="get")
    )
    node_a = start_agents(cluster)
    with node_a.client(ALICE) as api:
        one = api.get(f"{AGG}/nodedevices/node-b")
    assert one.status_code == 200, one.text
    assert one.json()["metadata"]["name"] == "node-b"
    assert [p.hits for p in broken.values()] == [0, 0]
    agents = "/api/v1/namespaces/gpu-hotmount/pods?"
    listed = [p for m, p in cluster.kube.requests() if m == "GET" and p.startswith(agents)]
    assert listed and all("nodeName%3Dnode-b" in p for p in listed)  # no list of all agents


def test_a_fanned_out_list_costs_the_api_server_one_list_of_agent_pods(cluster: Cluster) -> None:
    """Decisions cached (as every agent caches them), a list from node-a costs: node-a's
    list of agent pods, and node-a's own books (its ResourceSlices). node-b answers its
    part without asking the API server anything: no ResourceSlices, no node, no review."""
    node_a = start_agents(cluster)
    with node_a.client(ALICE) as api:
        assert api.get(f"{AGG}/nodedevices").status_code == 200  # warms the caches
        before = len(cluster.kube.requests())
        again = api.get(f"{AGG}/nodedevices")
    assert again.status_code == 200, again.text
    assert len(again.json()["items"]) == 2
    during = cluster.kube.requests()[before:]
    assert sorted(during) == [
        ("GET", "/api/v1/namespaces/gpu-hotmount/pods?labelSelector=app.kubernetes.io/name%3D"
         "gpu-hotmount&resourceVersion=0"),
        ("GET", "/apis/resource.k8s.io/v1/resourceslices?fieldSelector=spec.nodeName%3Dnode-a"),
    ]  # fmt: skip
