"""What another node's agent receives of a bearer caller's token (issue 40).

Every agent reaches every other, so root on one node reads whatever the others send it.
A caller's token is therefore forwarded (to the pod's node, or to every agent in a list)
only when it is bound to the agents' audience (--token-audiences), and so opens nothing
else; otherwise, by default, the forwarding agent asserts the caller with its own
ServiceAccount token, as it does for front-proxy callers. A recording stand-in peer
(tests/fakes/agent_peers.py) is the compromised node: it keeps every header it gets.
Real agent processes, the fake API server with real TokenReview audience semantics.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from tests.agent.conftest import AGENT_TOKEN, ALICE, Cluster
from tests.fakes.agent_peers import AnsweringPeer, Recorded
from tests.fakes.kube_apiserver import API_AUDIENCE
from tests.support.agent import GPUS, AgentProcess, agent_pod_manifest

pytestmark = pytest.mark.kernel
AGG = "/apis/hotmount.io/v1alpha1"
PEER_NODE = "node-peer"
FAR = "/v1/namespaces/default/pods/far/devices"  # a pod on the peer's node
EMPTY_LIST = b'{"apiVersion":"hotmount.io/v1alpha1","kind":"GPUMountList","items":[]}'
ALL_ANSWERED = dict.fromkeys(("mount", "unmount", "gpumounts", "nodedevices"), 200)
ALICE_BOUND = "alice-hotmount"  # alice's token for the agents' audience alone
AUDIENCE = "hotmount"
NVIDIA3 = f"/dev/nvidia{GPUS[0].minor}"


def far_pod() -> dict[str, Any]:
    """A Running pod on the peer's node: the asked agent forwards, never touches it."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "far", "namespace": "default", "uid": str(uuid.uuid4())},
        "spec": {"nodeName": PEER_NODE, "containers": [{"name": "main", "image": "busybox"}]},
        "status": {
            "phase": "Running",
            "containerStatuses": [
                {
                    "name": "main",
                    "containerID": f"containerd://{'ab' * 32}",
                    "state": {"running": {"startedAt": "2026-11-20T00:00:00Z"}},
                    "ready": True,
                    "restartCount": 0,
                    "image": "busybox",
                    "imageID": "busybox",
                }
            ],
        },
    }


@pytest.fixture
def peer(cluster: Cluster) -> Iterator[AnsweringPeer]:
    """The agent of another node, compromised: it answers and keeps what it was sent."""
    cluster.kube.add_token(ALICE_BOUND, "alice", ["ml"], audiences=[AUDIENCE])
    recording = AnsweringPeer(200, EMPTY_LIST)
    cluster.kube.put_pod(agent_pod_manifest(PEER_NODE, recording.port))
    cluster.kube.put_pod(far_pod())
    try:
        yield recording
    finally:
        recording.stop()


def ask(agent: AgentProcess, token: str) -> dict[str, int]:
    """A forwarded mount, a forwarded unmount and two lists across the cluster, as `token`;
    the status of each."""
    with agent.client(token) as api:
        return {
            "mount": api.post(FAR, json={"devices": ["0"]}).status_code,
            "unmount": api.delete(f"{FAR}/0").status_code,
            "gpumounts": api.get(f"{AGG}/gpumounts").status_code,
            "nodedevices": api.get(f"{AGG}/nodedevices").status_code,
        }


def bearers(seen: list[Recorded]) -> set[str]:
    tokens = set()
    for one in seen:
        for value in one.header("authorization"):
            scheme, _, token = value.partition(" ")
            assert scheme.lower() == "bearer", value
            tokens.add(token)
    return tokens


def test_by_default_a_peer_never_receives_a_callers_token(
    cluster: Cluster, peer: AnsweringPeer
) -> None:
    """No --token-audiences: alice's token is good for the API server, so it stays on the
    agent she called. The peer gets the agents' own token and alice asserted (user,
    groups), for the forwarded calls and for the lists alike."""
    node_a = cluster.agent("node-a")
    assert ask(node_a, ALICE) == ALL_ANSWERED
    methods = sorted({r.method for r in peer.requests})
    assert methods == ["DELETE", "GET", "POST"], peer.requests
    assert bearers(peer.requests) == {AGENT_TOKEN}
    for one in peer.requests:
        assert one.header("x-hotmount-user") == ["alice"], one
        assert "ml" in one.header("x-hotmount-group"), one
        assert not any(ALICE in value for _, value in one.headers), one


def test_with_audiences_a_peer_receives_only_tokens_bound_to_them(
    cluster: Cluster, peer: AnsweringPeer
) -> None:
    """--token-audiences hotmount: alice's token for that audience is forwarded as it came
    (the peer reviews it itself, and it opens nothing else); her token for the API server
    is refused where she called, so it reaches no peer either."""
    node_a = cluster.agent("node-a", extra=["--token-audiences", AUDIENCE])
    assert ask(node_a, ALICE_BOUND) == ALL_ANSWERED
    assert sorted({r.method for r in peer.requests}) == ["DELETE", "GET", "POST"]
    assert bearers(peer.requests) == {ALICE_BOUND}
    assert all(not r.header("x-hotmount-user") for r in peer.requests)
    for token in bearers(peer.requests):
        assert cluster.kube.token_audiences(token) == (AUDIENCE,)

    before = len(peer.requests)
    assert set(ask(node_a, ALICE).values()) == {401}
    assert len(peer.requests) == before


def test_audiences_that_admit_the_api_servers_tokens_forward_none(
    cluster: Cluster, peer: AnsweringPeer
) -> None:
    """--token-audiences that name the API server's own audience too admit full API
    tokens: no token is then known to be bound, so every caller is asserted (and the
    agent says why in its log)."""
    extra = ["--token-audiences", AUDIENCE, "--token-audiences", API_AUDIENCE]
    node_a = cluster.agent("node-a", extra=extra)
    for token in (ALICE, ALICE_BOUND):
        assert ask(node_a, token)["mount"] == 200
    assert bearers(peer.requests) == {AGENT_TOKEN}
    assert all(r.header("x-hotmount-user") == ["alice"] for r in peer.requests)
    assert "admit the API server's own tokens" in node_a.log.read_text()


def test_force_across_nodes_needs_a_forwarded_token(cluster: Cluster) -> None:
    """The price of asserting: an asserted user may not force (nor move an interface)
    without --allow-asserted-force. alice's forced unmount for a pod on node-b, sent to an
    agent without --token-audiences, is asserted and gets 403 from node-b; sent to one
    with them, her token for the agents' audience is forwarded, node-b reviews it itself,
    and the force goes through. (node-b runs with the audience throughout: it believes
    the agents' own token for assertions all the same.)"""
    cluster.kube.add_token(ALICE_BOUND, "alice", ["ml"], audiences=[AUDIENCE])
    container = cluster.pod("nb", node="node-b")
    near = "/v1/namespaces/default/pods/nb/devices"
    audience = ["--token-audiences", AUDIENCE]
    node_b = cluster.agent("node-b", extra=audience)
    with node_b.client(ALICE_BOUND) as own_node:
        assert own_node.post(near, json={"devices": ["0"]}).status_code == 200
    assert container.open_result(NVIDIA3) == "ENXIO"

    with cluster.agent("node-a").client(ALICE) as api:
        refused = api.delete(f"{near}/0", params={"force": "true"})
    assert refused.status_code == 403, refused.text
    assert "--allow-asserted-force" in refused.json()["message"]
    assert container.open_result(NVIDIA3) == "ENXIO"

    bound = cluster.agent("node-a", state="state-node-a-audience", extra=audience)
    with bound.client(ALICE_BOUND) as api:
        forced = api.delete(f"{near}/0", params={"force": "true"})
    assert forced.status_code == 200, forced.text
    assert container.open_result(NVIDIA3) == "ENOENT"
