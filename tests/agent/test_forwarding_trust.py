"""What a token, and the token every agent holds, can make other agents do (issue 29).

Real agent processes and the fake API server with real TokenReview and
SubjectAccessReview semantics (audiences, `system:masters`); a stand-in peer agent
(tests/fakes/agent_peers.py) counts the fan-out GETs that reach it. Each test attacks one
hole: a token with no rights setting off reads and a cluster-wide fan-out; root on a node
asserting a privileged identity, or forcing as someone else; forwarding that broke under
--token-audiences; a PATCH that told which pods exist before it was authorized. Which
token goes to another agent at all is tests/agent/test_token_forwarding.py (issue 40):
a caller's own only where it is bound to the agents' audience, else an assertion.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from tests.agent.conftest import AGENT_TOKEN, ALICE, BOB, DANA, Cluster
from tests.agent.test_holder_leaks import reconciles
from tests.fakes.agent_peers import AnsweringPeer
from tests.fakes.kube_apiserver import FrontProxy
from tests.fakes.pki import CertificateAuthority
from tests.support.agent import AGENT_USER, GPUS, AgentProcess, agent_pod_manifest, free_port
from tests.support.waiting import wait_for

pytestmark = pytest.mark.kernel
AGG = "/apis/hotmount.io/v1alpha1"
EVERYWHERE = f"{AGG}/gpumounts"
MOUNT = "/v1/namespaces/default/pods/nb/devices"
NVIDIA3 = f"/dev/nvidia{GPUS[0].minor}"
AS_ALICE = {"x-hotmount-user": "alice", "x-hotmount-group": "ml"}
EMPTY_LIST = b'{"apiVersion":"hotmount.io/v1alpha1","kind":"GPUMountList","items":[]}'


def names(answer: httpx.Response) -> list[str]:
    assert answer.status_code == 200, answer.text
    return sorted(i["metadata"]["name"] for i in answer.json()["items"])


def pod_reads(requests: list[tuple[str, str]]) -> list[str]:
    """Pod GETs, less the reconcile loop's own reads of its pins (every second, whoever calls:
    under load one falls inside any window a test watches)."""
    return [
        path
        for method, path in requests
        if method == "GET" and "/pods/" in path and "/pods/hotmount-pin-" not in path
    ]


def reviewed_tokens(cluster: Cluster) -> list[str]:
    return [r["spec"]["token"] for r in cluster.kube.reviews("TokenReview")]


# -- item 2: authorize a list before any work ------------------------------------------------


def test_a_list_by_a_token_with_no_rights_reads_no_pod_and_asks_no_other_agent(
    cluster: Cluster,
) -> None:
    cluster.pod("nb", node="node-a")
    peer = AnsweringPeer(200, EMPTY_LIST)
    cluster.kube.put_pod(agent_pod_manifest("node-peer", peer.port))
    # No reconcile pass after the first: its reads (pins, holder pods) would share the
    # window below with bob's list, and what is asserted is what bob's list reads.
    node_a = cluster.agent("node-a", extra=["--reconcile-interval", "3600"])
    try:
        with node_a.client(ALICE) as api:
            assert api.post(MOUNT, json={"devices": ["0"]}).status_code == 200
            assert names(api.get(EVERYWHERE)) == ["nb"]
        assert peer.hits == 1  # alice may list at the cluster scope: the list fans out
        wait_for(lambda: reconciles(node_a) >= 1, "the agent's first reconcile pass to end")

        before = len(cluster.kube.requests())
        with node_a.client(BOB) as bob:
            refused = bob.get(EVERYWHERE)
        assert names(refused) == []
        during = cluster.kube.requests()[before:]
        assert pod_reads(during) == []
        assert {p.split("?")[0] for _, p in during} <= {
            "/apis/authentication.k8s.io/v1/tokenreviews",
            "/apis/authorization.k8s.io/v1/subjectaccessreviews",
        }
        assert peer.hits == 1  # bob asked no other agent

        # a tenant who may list one namespace sees it on this node, and asks no other agent
        with node_a.client(DANA) as dana:
            tenant = dana.get(EVERYWHERE)
        assert names(tenant) == ["nb"]
        assert any("cluster scope" in w for w in tenant.headers.get_list("warning"))
        assert peer.hits == 1
    finally:
        peer.stop()


# -- item 4: what the token every agent holds may assert -------------------------------------


def test_privileged_identities_are_never_taken_from_an_assertion(cluster: Cluster) -> None:
    """Root on any node holds the agents' token: asserting system:masters (allowed all by
    the API server), a node, or the agents' own account gets 403, and nothing is mounted."""
    container = cluster.pod("nb", node="node-b")
    node_b = cluster.agent("node-b")
    asserted: list[dict[str, Any]] = [
        {"x-hotmount-user": "mallory", "x-hotmount-group": "system:masters"},
        {"x-hotmount-user": "system:node:node-a", "x-hotmount-group": "system:nodes"},
        {"x-hotmount-user": "alice", "x-hotmount-group": ["ml", "system:nodes"]},
        {"x-hotmount-user": "system:node:node-a"},
        {"x-hotmount-user": AGENT_USER},
    ]
    with node_b.client(AGENT_TOKEN) as agents:
        for headers in asserted:
            answer = agents.post(MOUNT, json={"devices": ["0"]}, headers=list(_pairs(headers)))
            assert answer.status_code == 403, (headers, answer.text)
            assert "privileged identity" in answer.json()["message"], answer.text
    assert container.open_result(NVIDIA3) == "ENOENT"


def _pairs(headers: dict[str, Any]) -> list[tuple[str, str]]:
    return [
        (name, one)
        for name, value in headers.items()
        for one in (value if isinstance(value, list) else [value])
    ]


def test_an_asserted_user_may_not_force_or_move_an_interface(cluster: Cluster) -> None:
    """alice may force in `default`; asserted by another agent she may not, nor move a
    network interface. Her own token, reviewed by this agent, still may force."""
    container = cluster.pod("nb", node="node-b")
    node_b = cluster.agent("node-b")
    with node_b.client(AGENT_TOKEN) as agents:
        forced = agents.post(MOUNT, json={"devices": ["0"], "force": True}, headers=AS_ALICE)
        moved = agents.post(
            MOUNT, json={"devices": ["0"], "netdev": {"name": "hm-none0"}}, headers=AS_ALICE
        )
        plain = agents.post(MOUNT, json={"devices": ["0"]}, headers=AS_ALICE)
        unforced = agents.delete(f"{MOUNT}/0", params={"force": "true"}, headers=AS_ALICE)
    for refused in (forced, moved, unforced):
        assert refused.status_code == 403, refused.text
        assert "--allow-asserted-force" in refused.json()["message"]
    assert plain.status_code == 200, plain.text  # the assertion itself still works
    assert container.open_result(NVIDIA3) == "ENXIO"

    with node_b.client(ALICE) as api:
        own = api.delete(f"{MOUNT}/0", params={"force": "true"})
    assert own.status_code == 200, own.text
    assert container.open_result(NVIDIA3) == "ENOENT"


def test_the_operator_may_let_asserted_users_force(cluster: Cluster) -> None:
    container = cluster.pod("nb", node="node-b")
    node_b = cluster.agent("node-b", extra=["--allow-asserted-force"])
    with node_b.client(AGENT_TOKEN) as agents:
        forced = agents.post(MOUNT, json={"devices": ["0"], "force": True}, headers=AS_ALICE)
    assert forced.status_code == 200, forced.text
    assert container.open_result(NVIDIA3) == "ENXIO"


def test_a_forwarded_call_with_an_api_server_token_is_asserted_and_the_peer_authorizes_it(
    cluster: Cluster,
) -> None:
    """alice's token is good for the API server (no --token-audiences): node-b never sees
    it. node-a asserts her with the agents' token; node-b reviews that token, believes the
    assertion from the agents' account alone and asks its own SubjectAccessReview."""
    container = cluster.pod("nb", node="node-b")
    node_a, node_b = cluster.agent("node-a"), cluster.agent("node-b")
    with node_a.client(ALICE) as api:
        mounted = api.post(MOUNT, json={"devices": ["0"]})
    assert mounted.status_code == 200, mounted.text
    assert container.open_result(NVIDIA3) == "ENXIO"

    tokens = reviewed_tokens(cluster)
    assert tokens.count(ALICE) == 1  # node-a's review only: the token stayed there
    assert AGENT_TOKEN in tokens  # node-b's review of the token that asserts
    audit = node_b.messages("hotmount.audit")
    assert any(m.startswith("allow user=alice via=gateway verb=create") for m in audit), audit
    assert not any("via=token" in m for m in audit), audit


def test_forwarding_works_when_tokens_must_carry_the_agents_audience(cluster: Cluster) -> None:
    """--token-audiences hotmount: alice's token for that audience is forwarded and
    reviewed for it; the front-proxy path (the agents' own token, minted for the API
    server, with an assertion) is still believed from the agents' account alone."""
    cluster.kube.add_token("alice-hotmount", "alice", ["ml"], audiences=["hotmount"])
    container = cluster.pod("nb", node="node-b")
    audience = ["--token-audiences", "hotmount"]
    node_a = cluster.agent("node-a", extra=audience)
    node_b = cluster.agent("node-b", extra=audience)

    with node_a.client("alice-hotmount") as api:
        mounted = api.post(MOUNT, json={"devices": ["0"]})
    assert mounted.status_code == 200, mounted.text
    assert container.open_result(NVIDIA3) == "ENXIO"
    audit = node_b.messages("hotmount.audit")  # her own token, reviewed by node-b
    assert any(m.startswith("allow user=alice via=token verb=create") for m in audit), audit

    with node_b.client(AGENT_TOKEN) as agents:
        asserted = agents.get(MOUNT, headers=AS_ALICE)
        alone = agents.get(MOUNT)  # the agents' token, no assertion: not for this audience
    assert asserted.status_code == 200, asserted.text
    assert alone.status_code == 401, alone.text
    with node_b.client(ALICE) as api:  # alice's token for the API server only
        assert api.get(MOUNT).status_code == 401
        assert api.get(MOUNT, headers=AS_ALICE).status_code == 401


def front_proxied_pair(cluster: Cluster, extra: list[str]) -> tuple[AgentProcess, AgentProcess]:
    """node-a behind the API server's front proxy (the APIService's backend), node-b the
    pod's node; both serve TLS with a certificate for the agents' Service name, and each
    trusts the other's (--agent-ca), as the chart sets them up."""
    pki = cluster.workdir / "pki-pair"
    serving = CertificateAuthority(pki / "serving", "agents-ca").issue_server(
        "agent", hosts=["127.0.0.1", "localhost", "gpu-hotmount.gpu-hotmount.svc"]
    )
    requestheader = CertificateAuthority(pki / "requestheader", "requestheader-ca")
    port = free_port()
    cluster.kube.configure_front_proxy(
        FrontProxy(
            backend_url=f"https://127.0.0.1:{port}",
            client=requestheader.issue_client("front-proxy-client"),
            backend_ca=serving.ca,
        )
    )
    flags = ["--agent-ca", str(serving.ca), *extra]
    node_a = cluster.agent("node-a", port=port, tls=serving, extra=flags)
    node_b = cluster.agent("node-b", tls=serving, extra=flags)
    return node_a, node_b


def test_a_kubectl_call_for_another_node_is_asserted_within_the_new_bounds(
    cluster: Cluster,
) -> None:
    """Through the API server (front proxy) to node-a, for a pod on node-b, with
    --token-audiences set: alice is asserted with the agents' own token and node-b
    believes it; her forced unmount is refused there; the admin whose only right is
    system:masters is asserted without that group, and node-b's RBAC says no."""
    container = cluster.pod("nb", node="node-b")
    node_a, node_b = front_proxied_pair(cluster, ["--token-audiences", "hotmount"])
    gpumounts = f"{AGG}/namespaces/default/gpumounts"
    body = {"apiVersion": "hotmount.io/v1alpha1", "kind": "GPUMount"}
    with cluster.api(ALICE) as api:
        created = api.post(gpumounts, json={**body, "metadata": {"name": "nb"},
                                             "spec": {"devices": ["0"]}})  # fmt: skip
        assert created.status_code == 201, created.text
        assert container.open_result(NVIDIA3) == "ENXIO"
        forced = api.delete(f"{gpumounts}/nb", params={"force": "true"})
    assert forced.status_code == 403, forced.text
    assert "--allow-asserted-force" in forced.json()["message"]
    assert container.open_result(NVIDIA3) == "ENXIO"
    with cluster.api(cluster.kube.admin_token) as admin:
        seen = admin.get(f"{gpumounts}/nb")
    assert seen.status_code == 403, seen.text

    audit = node_b.messages("hotmount.audit")
    assert any(m.startswith("allow user=alice via=gateway verb=create") for m in audit), audit
    assert any(m.startswith("deny user=kubernetes-admin via=gateway verb=get") for m in audit)
    admins = [
        r["spec"]["groups"]
        for r in cluster.kube.reviews("SubjectAccessReview")
        if r["spec"]["user"] == "kubernetes-admin"
    ]
    assert admins == [["system:masters", "system:authenticated"], ["system:authenticated"]]
    assert any(m.startswith("forwarding") for m in node_a.messages("agent.cluster.gateway"))


# -- item 6: PATCH authorizes before it looks the pod up -------------------------------------


def test_patch_without_rights_is_403_whether_the_pod_exists_or_not(cluster: Cluster) -> None:
    cluster.pod("nb", node="node-a")
    cluster.pod("far", node="node-b")
    node_a = cluster.agent("node-a")
    cluster.agent("node-b")
    before = len(cluster.kube.requests())
    patch = json.dumps({"spec": {"devices": ["0"]}})
    with node_a.client(BOB) as bob:
        answers = {
            pod: bob.patch(
                f"{AGG}/namespaces/default/gpumounts/{pod}",
                content=patch,
                headers={"content-type": "application/merge-patch+json"},
            )
            for pod in ("nb", "far", "ghost")
        }
    for pod, answer in answers.items():
        assert answer.status_code == 403, (pod, answer.text)
        message = answer.json()["message"].replace(pod, "POD")
        assert message == 'user "bob" cannot create gpumounts.hotmount.io in the namespace ' + (
            '"default" (pod default/POD)'
        )
    assert pod_reads(cluster.kube.requests()[before:]) == []
    assert not any(m.startswith("forwarding") for m in node_a.messages("agent.cluster.gateway"))
