"""A list across the cluster survives what a compromised node's agent can send it.

Root on one GPU node holds the agents' token and can answer other agents' lists with
anything (agent/cluster/peer_answers.py). node-a is a real agent; the stand-ins, registered as
agent pods of their own nodes, send: a body larger than --list-max-bytes (declared, and
streamed without end), a trickle, one malformed item, objects of another node, and ANSI
escapes in their error. Each becomes a missing node with a reason, never a 500, never
an item of the list. And one caller cannot hold more than --max-lists-per-caller lists
in flight on an agent: past that, 429 with Retry-After.
"""

from __future__ import annotations

import json
import threading
import unicodedata
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.agent.conftest import ALICE, DANA, Cluster
from tests.fakes.agent_peers import AnsweringPeer, HoldingPeer, StreamingPeer
from tests.support.agent import AgentProcess, agent_pod_manifest

pytestmark = pytest.mark.kernel
AGG = "/apis/hotmount.io/v1alpha1"
TABLE = "application/json;as=Table;v=v1;g=meta.k8s.io, application/json"
QUIET = ["--authz-cache-ttl", "60", "--reconcile-interval", "3600"]
CREATED = "2026-01-01T00:00:00+00:00"


def node_devices(node: str, created: str = CREATED) -> dict[str, Any]:
    return {
        "apiVersion": "hotmount.io/v1alpha1",
        "kind": "NodeDevices",
        "metadata": {"name": node, "creationTimestamp": created},
        "status": {"node": node, "devices": []},
    }


def gpumount(pod: str, node: str, namespace: str = "default") -> dict[str, Any]:
    return {
        "apiVersion": "hotmount.io/v1alpha1",
        "kind": "GPUMount",
        "metadata": {"name": pod, "namespace": namespace, "creationTimestamp": CREATED},
        "status": {"namespace": namespace, "pod": pod, "node": node, "containers": []},
    }


def as_list(*items: Any) -> bytes:
    return json.dumps({"items": list(items)}).encode()


def missing_of(answer: httpx.Response) -> dict[str, dict[str, str]]:
    return {m["node"]: m for m in answer.json()["metadata"].get("missingNodes", [])}


@pytest.fixture
def peers(cluster: Cluster) -> Iterator[dict[str, Any]]:
    made: dict[str, Any] = {}

    def register(node: str, peer: Any) -> None:
        made[node] = peer
        cluster.kube.put_pod(agent_pod_manifest(node, peer.port))

    yield {"register": register, "made": made}
    for peer in made.values():
        peer.stop()


def start_node_a(cluster: Cluster, *extra: str) -> AgentProcess:
    return cluster.agent("node-a", extra=[*QUIET, "--list-timeout", "2", *extra])


def test_a_body_over_the_cap_is_cut_off_and_its_node_named(
    cluster: Cluster, peers: dict[str, Any]
) -> None:
    padding = b"x" * (1 << 20)

    def endless() -> Iterator[bytes]:  # a valid list, if it ever ended: 256 MiB of it
        yield b'{"items": [], "padding": "'
        for _ in range(256):
            yield padding

    streaming = StreamingPeer(endless)
    peers["register"]("node-streaming", streaming)
    declared = json.dumps({"items": [], "padding": "x" * (2 << 20)}).encode()
    peers["register"]("node-declared", AnsweringPeer(200, declared))
    node_a = start_node_a(cluster, "--list-max-bytes", str(1 << 20))
    with node_a.client(ALICE) as api:
        listed = api.get(f"{AGG}/nodedevices")
    assert listed.status_code == 200, listed.text
    missing = missing_of(listed)
    for node in ("node-streaming", "node-declared"):
        assert missing[node]["reason"] == "BadAnswer", missing
        assert "--list-max-bytes" in missing[node]["message"]
    assert streaming.hung_up.wait(30), "node-a read the whole body"
    assert streaming.sent < 256 << 20


def test_a_trickle_is_cut_off_at_its_deadline_and_the_ask_stops(
    cluster: Cluster, peers: dict[str, Any]
) -> None:
    def trickle() -> Iterator[bytes]:  # a valid list, a byte every 0.1 s: 10 minutes long
        yield b'{"items": [], "padding": "'
        yield from (b"x" for _ in range(6000))
        yield b'"}'

    slow = StreamingPeer(trickle, pause=0.1)
    peers["register"]("node-trickle", slow)
    node_a = start_node_a(cluster, "--list-deadline", "30")
    with node_a.client(ALICE) as api:
        listed = api.get(f"{AGG}/nodedevices")
    assert listed.status_code == 200, listed.text
    trickled = missing_of(listed)["node-trickle"]
    assert trickled["reason"] == "Timeout"
    assert "still sending" in trickled["message"], trickled  # its own deadline, not the list's
    assert slow.hung_up.wait(30), "node-a is still reading the trickle"


def test_a_malformed_item_makes_its_node_missing_not_the_list_a_500(
    cluster: Cluster, peers: dict[str, Any]
) -> None:
    bad_time = as_list(node_devices("node-malformed", created="yesterday"))
    not_an_object = as_list(5)
    peers["register"](
        "node-malformed",
        AnsweringPeer(200, bad_time, by_path={"/gpumounts": not_an_object}),
    )
    cluster.agent("node-b", extra=QUIET)
    node_a = start_node_a(cluster)
    with node_a.client(ALICE) as api:
        for path in ("nodedevices", "gpumounts", "namespaces/default/gpumounts"):
            for accept in (TABLE, "application/json"):
                listed = api.get(f"{AGG}/{path}", headers={"accept": accept})
                assert listed.status_code == 200, (path, accept, listed.text)
                assert missing_of(listed)["node-malformed"]["reason"] == "BadAnswer"
        nodes = api.get(f"{AGG}/nodedevices", headers={"accept": TABLE})
    assert {row["cells"][0] for row in nodes.json()["rows"]} == {"node-a", "node-b"}


def test_objects_of_another_node_are_dropped_and_the_peer_named(
    cluster: Cluster, peers: dict[str, Any]
) -> None:
    """node-liar answers with node-b's NodeDevices and a GPUMount on node-b: node-b's
    own agent is the only one believed about node-b."""
    peers["register"](
        "node-liar",
        AnsweringPeer(
            200,
            as_list(node_devices("node-liar"), node_devices("node-b")),
            by_path={"/gpumounts": as_list(gpumount("planted", "node-b"))},
        ),
    )
    peers["register"](
        "node-elsewhere",  # its own node, another namespace than the one listed
        AnsweringPeer(
            200, b"", by_path={"/gpumounts": as_list(gpumount("p", "node-elsewhere", "x"))}
        ),
    )
    cluster.agent("node-b", extra=QUIET)
    node_a = start_node_a(cluster)
    with node_a.client(ALICE) as api:
        nodes = api.get(f"{AGG}/nodedevices")
        mounts = api.get(f"{AGG}/namespaces/default/gpumounts")
    assert nodes.status_code == 200, nodes.text
    assert sorted(i["metadata"]["name"] for i in nodes.json()["items"]) == ["node-a", "node-b"]
    liar = missing_of(nodes)["node-liar"]
    assert liar["reason"] == "BadAnswer" and "another node (node-b)" in liar["message"]
    assert mounts.status_code == 200, mounts.text
    assert "planted" not in [i["metadata"]["name"] for i in mounts.json()["items"]]
    assert missing_of(mounts)["node-liar"]["reason"] == "BadAnswer"
    assert "another namespace" in missing_of(mounts)["node-elsewhere"]["message"]


def test_escapes_in_a_peers_error_reach_no_one_raw(cluster: Cluster, peers: dict[str, Any]) -> None:
    status = {"kind": "Status", "message": "\x1b[2J\x1b]0;owned\x07\u202eok\r\nnext line"}
    peers["register"]("node-escapes", AnsweringPeer(503, json.dumps(status).encode()))
    node_a = start_node_a(cluster)
    with node_a.client(ALICE) as api:
        listed = api.get(f"{AGG}/nodedevices")
    assert listed.status_code == 200, listed.text
    message = missing_of(listed)["node-escapes"]["message"]
    assert "?[2J?]0;owned?" in message
    assert [c for c in message if unicodedata.category(c) in ("Cc", "Cf")] == []
    assert "\x1b" not in node_a.log.read_text()


def test_one_caller_has_at_most_its_lists_in_flight(
    cluster: Cluster, peers: dict[str, Any]
) -> None:
    held = HoldingPeer(as_list(node_devices("node-held")))
    peers["register"]("node-held", held)
    node_a = start_node_a(cluster, "--list-timeout", "20", "--max-lists-per-caller", "1")
    answers: dict[str, httpx.Response] = {}

    def list_as(token: str, path: str) -> threading.Thread:
        def run() -> None:
            with node_a.client(token) as api:
                answers[token] = api.get(f"{AGG}/{path}")

        thread = threading.Thread(target=run)
        thread.start()
        return thread

    in_flight = [list_as(ALICE, "nodedevices")]
    try:
        assert held.arrived.acquire(timeout=30), "alice's list never reached node-held"
        with node_a.client(ALICE) as api:
            refused = api.get(f"{AGG}/nodedevices")
        assert refused.status_code == 429, refused.text
        assert refused.json()["reason"] == "TooManyRequests"
        assert int(refused.headers["retry-after"]) >= 1
        # Another caller is not bounded by alice's lists: dana's reaches node-held too.
        in_flight.append(list_as(DANA, "namespaces/default/gpumounts"))
        assert held.arrived.acquire(timeout=30), "dana's list never reached node-held"
    finally:
        held.release.set()
        for thread in in_flight:
            thread.join(60)
    assert answers[ALICE].status_code == 200, answers[ALICE].text
    assert "node-held" in [i["metadata"]["name"] for i in answers[ALICE].json()["items"]]
    assert answers[DANA].status_code == 200, answers[DANA].text
    with node_a.client(ALICE) as api:  # the slot is free again
        again = api.get(f"{AGG}/nodedevices")
    assert again.status_code == 200, again.text
