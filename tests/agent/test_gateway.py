"""Agent to agent: a request for a pod on another node is forwarded to that node's agent.

Two real agent processes (node-a and node-b) share the host, each with its own
state directory; the fake API server knows both as pods of the agents' DaemonSet.
The callers' tokens here are good for the API server (no --token-audiences), so they
stay on the agent they were sent to: the forwarding agent asserts the caller in
X-Hotmount-User/-Group with the agents' ServiceAccount token (the crafted calls here
stand for that path), and the receiving agent authorizes that user itself. A token
bound to the agents' audience is forwarded instead (tests/agent/test_token_forwarding.py).
A forwarded request is never forwarded again.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

import pytest

from tests.agent.conftest import AGENT_TOKEN, ALICE, Cluster
from tests.fakes.kube_apiserver import AccessRule, Attributes
from tests.support.agent import GPUS, AgentProcess

pytestmark = pytest.mark.kernel
GPU0 = GPUS[0]  # index 0 is minor 3: /dev/nvidia3
NVIDIA3 = f"/dev/nvidia{GPU0.minor}"


@dataclass(frozen=True)
class RevocableRule(AccessRule):
    """A grant in the fake API server's RBAC table that the test can take back."""

    revoked: threading.Event = field(default_factory=threading.Event, compare=False)

    def matches(self, req: Attributes) -> bool:
        return not self.revoked.is_set() and super().matches(req)


def requests_seen(agent: AgentProcess) -> list[dict[str, Any]]:
    return [e for e in agent.entries("hotmount.access") if e.get("path") != "/healthz"]


def holder_of(agent: AgentProcess, key: str) -> dict[str, Any] | None:
    with agent.client(ALICE) as api:
        answer = api.get("/v1/devices")
    assert answer.status_code == 200, answer.text
    return {d["key"]: d["holder"] for d in answer.json()["devices"]}[key]


def test_mount_get_unmount_forwarded_to_the_pods_node(cluster: Cluster) -> None:
    container = cluster.pod("nb", node="node-b")
    node_a, node_b = cluster.agent("node-a"), cluster.agent("node-b")
    path = "/v1/namespaces/default/pods/nb/devices"

    with node_a.client(ALICE) as api:
        mounted = api.post(path, json={"devices": ["0"]})
        assert mounted.status_code == 200, mounted.text
        assert mounted.json()["containerId"] == container.id
        assert [d["key"] for d in mounted.json()["mounted"]] == [GPU0.uuid]
        assert container.open_result(NVIDIA3) == "ENXIO"

        # node-b's agent did it, on its own ledger, for alice
        assert holder_of(node_b, GPU0.uuid)["pod"] == "nb"  # type: ignore[index]
        assert holder_of(node_a, GPU0.uuid) is None
        [event] = cluster.events("GPUMounted")
        assert event["involvedObject"]["name"] == "nb"
        assert event["message"].endswith("for alice")
        assert event["source"]["host"] == "node-b"

        status = api.get(path)
        assert status.status_code == 200, status.text
        assert [d["key"] for c in status.json()["containers"] for d in c["devices"]] == [GPU0.uuid]

        unmounted = api.delete(f"{path}/0")
        assert unmounted.status_code == 200, unmounted.text
        assert unmounted.json()["unmounted"] == [GPU0.uuid]
        assert container.open_result(NVIDIA3) == "ENOENT"
        [event] = cluster.events("GPUUnmounted")
        assert event["message"].endswith("for alice")

        # errors come back as node-b answered them
        again = api.delete(f"{path}/nvidia.com/gpu=nope")
        assert again.status_code in (400, 404), again.text
        assert again.json()["kind"] == "Status"

    forwarded = [m for m in node_a.messages("agent.cluster.gateway") if m.startswith("forwarding")]
    assert len(forwarded) == 4 and all("for alice to node-b" in m for m in forwarded)
    decisions = node_b.messages("hotmount.audit")
    for verb in ("create", "get", "delete"):
        assert any(
            m.startswith(f"allow user=alice via=gateway verb={verb} pod=default/nb")
            for m in decisions
        ), decisions
    assert not any(m.startswith("forwarding") for m in node_b.messages("agent.cluster.gateway"))


def test_lists_fan_out_to_every_agent(cluster: Cluster) -> None:
    a_pod = cluster.pod("on-a", node="node-a")
    b_pod = cluster.pod("on-b", node="node-b")
    node_a, _node_b = cluster.agent("node-a"), cluster.agent("node-b")
    with node_a.client(ALICE) as api:
        for pod, device in (("on-a", "0"), ("on-b", "1")):
            answer = api.post(
                f"/v1/namespaces/default/pods/{pod}/devices", json={"devices": [device]}
            )
            assert answer.status_code == 200, answer.text
        assert a_pod.open_result(NVIDIA3) == "ENXIO"
        assert b_pod.open_result(f"/dev/nvidia{GPUS[1].minor}") == "ENXIO"

        listed = api.get("/apis/hotmount.io/v1alpha1/namespaces/default/gpumounts")
        assert listed.status_code == 200, listed.text
        assert sorted(i["metadata"]["name"] for i in listed.json()["items"]) == ["on-a", "on-b"]

        nodes = api.get("/apis/hotmount.io/v1alpha1/nodedevices")
        assert nodes.status_code == 200, nodes.text
        assert sorted(i["metadata"]["name"] for i in nodes.json()["items"]) == ["node-a", "node-b"]


def test_receiving_agent_authorizes_the_forwarded_user_itself(cluster: Cluster) -> None:
    """node-a still believes alice may (it cached an allow); node-b asks again and refuses."""
    container = cluster.pod("gpu", namespace="other", node="node-b")
    grant = RevocableRule(
        user="alice", api_group="hotmount.io", resource="gpumounts", namespace="other"
    )
    cluster.kube.allow(grant)
    node_a = cluster.agent("node-a", extra=["--authz-cache-ttl", "300"])
    node_b = cluster.agent("node-b")
    path = "/v1/namespaces/other/pods/gpu/devices"

    with node_a.client(ALICE) as api:
        first = api.post(path, json={"devices": ["0"]})
        assert first.status_code == 200, first.text
        assert container.open_result(NVIDIA3) == "ENXIO"
        assert api.delete(f"{path}/0").status_code == 200
        assert container.open_result(NVIDIA3) == "ENOENT"

        grant.revoked.set()  # alice no longer has rights in namespace "other"

        refused = api.post(path, json={"devices": ["0"]})
        assert refused.status_code == 403, refused.text
        assert refused.json()["reason"] == "Forbidden"
        assert "other/gpu" in refused.json()["message"]
    assert container.open_result(NVIDIA3) == "ENOENT"
    assert any(
        m.startswith("deny user=alice via=gateway verb=create pod=other/gpu")
        for m in node_b.messages("hotmount.audit")
    )
    # node-a let it through from its cache: the refusal was node-b's
    assert not any(m.startswith("deny") for m in node_a.messages("hotmount.audit"))

    # the same asserted user, straight to node-b with the agents' token
    with node_b.client(AGENT_TOKEN) as agents:
        crafted = agents.post(
            path,
            json={"devices": ["0"]},
            headers={"x-hotmount-user": "alice", "x-hotmount-group": "ml"},
        )
    assert crafted.status_code == 403, crafted.text
    assert container.open_result(NVIDIA3) == "ENOENT"


def test_a_forwarded_request_is_never_forwarded_again(cluster: Cluster) -> None:
    container = cluster.pod("nb", node="node-a")
    node_a, node_b = cluster.agent("node-a"), cluster.agent("node-b")
    path = "/v1/namespaces/default/pods/nb/devices"
    as_alice = {"x-hotmount-user": "alice", "x-hotmount-group": "ml"}
    seen_before = len(requests_seen(node_a))

    with node_b.client(AGENT_TOKEN) as agents:
        answers = [
            agents.post(path, json={"devices": ["0"]}, headers=as_alice),
            agents.get(path, headers=as_alice),
            agents.delete(f"{path}/0", headers=as_alice),
            agents.post(
                "/apis/hotmount.io/v1alpha1/namespaces/default/gpumounts",
                json={
                    "apiVersion": "hotmount.io/v1alpha1",
                    "kind": "GPUMount",
                    "metadata": {"name": "nb"},
                    "spec": {"devices": ["0"]},
                },
                headers=as_alice,
            ),
        ]
    with node_b.client(ALICE) as api:  # a bearer caller, said to be forwarded once already
        answers.append(
            api.post(path, json={"devices": ["0"]}, headers={"x-hotmount-forwarded": "1"})
        )
    for answer in answers:
        assert answer.status_code == 421, answer.text
        body = answer.json()
        assert body["reason"] == "NotOnThisNode" and body["details"] == {"node": "node-a"}
    assert container.open_result(NVIDIA3) == "ENOENT"
    assert len(requests_seen(node_a)) == seen_before  # node-a never heard of them
    assert not any(m.startswith("forwarding") for m in node_b.messages("agent.cluster.gateway"))

    # while alice's own call is forwarded as usual
    with node_b.client(ALICE) as api:
        forwarded = api.post(path, json={"devices": ["0"]})
    assert forwarded.status_code == 200, forwarded.text
    assert container.open_result(NVIDIA3) == "ENXIO"
