"""The aggregated API `hotmount.io/v1alpha1`, called through the (fake) API server.

The fake API server authenticates the caller's token, authorizes with its RBAC
table, and forwards to the TLS agent with X-Remote-User/-Group over a connection
that presents its front-proxy client certificate; the agent trusts those headers
only because it verified that certificate against the request-header CA it read
from kube-system/extension-apiserver-authentication at startup.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.agent.conftest import ALICE, BOB, DANA, AggregatedAgent, Cluster
from tests.fakes.kube_apiserver import AccessRule
from tests.fakes.pki import CertificateAuthority
from tests.support.agent import GPUS

pytestmark = pytest.mark.kernel
GPU0 = GPUS[0]  # index 0 is minor 3: /dev/nvidia3
NVIDIA3 = f"/dev/nvidia{GPU0.minor}"
V1ALPHA1 = "/apis/hotmount.io/v1alpha1"
GPUMOUNTS = f"{V1ALPHA1}/namespaces/default/gpumounts"


def grant_cluster_resources(cluster: Cluster) -> None:
    """What the chart's ClusterRole gives users: nodedevices and reassignments too."""
    for resource in ("nodedevices", "reassignments"):
        cluster.kube.allow(AccessRule(group="ml", api_group="hotmount.io", resource=resource))


def gpumount(pod: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "hotmount.io/v1alpha1",
        "kind": "GPUMount",
        "metadata": {"name": pod},
        "spec": spec,
    }


def keys(status: dict[str, Any]) -> list[str]:
    return [d["key"] for c in status["containers"] for d in c["devices"]]


@pytest.fixture
def backend(cluster: Cluster) -> AggregatedAgent:
    grant_cluster_resources(cluster)
    return cluster.aggregated_agent()


def test_discovery(cluster: Cluster, backend: AggregatedAgent) -> None:
    with cluster.api(ALICE) as api:
        resources = api.get(V1ALPHA1)
    assert resources.status_code == 200, resources.text
    doc = resources.json()
    assert (doc["kind"], doc["groupVersion"]) == ("APIResourceList", "hotmount.io/v1alpha1")
    by_name = {r["name"]: r for r in doc["resources"]}
    assert set(by_name) == {
        "gpumounts", "gpumounts/suspend", "gpumounts/resume", "gpumounts/acquire",
        "gpumounts/release", "nodedevices", "reassignments"
    }  # fmt: skip
    assert by_name["gpumounts/suspend"]["verbs"] == ["create", "get"]
    assert by_name["gpumounts/acquire"]["verbs"] == ["create"]
    assert by_name["gpumounts"]["namespaced"] is True
    assert by_name["gpumounts"]["kind"] == "GPUMount"
    assert set(by_name["gpumounts"]["verbs"]) == {"create", "delete", "get", "list", "patch"}
    assert by_name["nodedevices"]["namespaced"] is False
    assert by_name["reassignments"]["verbs"] == ["create"]

    # The group document: kube-apiserver builds it from the APIService itself; the
    # fake does not route /apis/<group>, so ask the agent as the front proxy would.
    with backend.client(backend.front_proxy) as proxy:
        group = proxy.get("/apis/hotmount.io", headers={"x-remote-user": "alice"})
    assert group.status_code == 200, group.text
    assert group.json()["kind"] == "APIGroup" and group.json()["name"] == "hotmount.io"
    assert group.json()["preferredVersion"]["groupVersion"] == "hotmount.io/v1alpha1"

    with cluster.api() as anonymous:  # discovery still needs an authenticated user
        assert anonymous.get(V1ALPHA1).status_code == 401


def test_gpumount_lifecycle_through_the_api_server(
    cluster: Cluster, backend: AggregatedAgent
) -> None:
    nb = cluster.pod("nb")
    other = cluster.pod("nb2")
    with cluster.api(ALICE) as api:
        created = api.post(GPUMOUNTS, json=gpumount("nb", devices=["0"]))
        assert created.status_code == 201, created.text
        obj = created.json()
        assert (obj["kind"], obj["apiVersion"]) == ("GPUMount", "hotmount.io/v1alpha1")
        assert obj["metadata"] == {"name": "nb", "namespace": "default"}
        assert obj["spec"]["devices"] == ["0"]
        assert [d["key"] for d in obj["status"]["mounted"]] == [GPU0.uuid]
        assert obj["status"]["containerId"] == nb.id
        assert nb.open_result(NVIDIA3) == "ENXIO"
        assert other.open_result(NVIDIA3) == "ENOENT"

        got = api.get(f"{GPUMOUNTS}/nb")
        assert got.status_code == 200, got.text
        assert got.json()["kind"] == "GPUMount" and keys(got.json()["status"]) == [GPU0.uuid]

        listed = api.get(GPUMOUNTS)
        assert listed.status_code == 200, listed.text
        assert listed.json()["kind"] == "GPUMountList"
        assert [i["metadata"]["name"] for i in listed.json()["items"]] == ["nb"]

        node = api.get(f"{V1ALPHA1}/nodedevices/node-a")
        assert node.status_code == 200, node.text
        assert node.json()["kind"] == "NodeDevices"
        holders = {d["key"]: d["holder"] for d in node.json()["status"]["devices"]}
        assert holders[GPU0.uuid]["source"] == "hotmount"
        assert holders[GPU0.uuid]["pod"] == "nb"

        moved = api.post(
            f"{V1ALPHA1}/reassignments",
            json={
                "apiVersion": "hotmount.io/v1alpha1",
                "kind": "Reassignment",
                "spec": {
                    "device": "0",
                    "from": {"namespace": "default", "pod": "nb"},
                    "to": {"namespace": "default", "pod": "nb2"},
                },
            },
        )
        assert moved.status_code == 201, moved.text
        assert moved.json()["kind"] == "Reassignment"
        assert moved.json()["status"]["unmounted"]["unmounted"] == [GPU0.uuid]
        assert moved.json()["status"]["mounted"]["containerId"] == other.id
        assert nb.open_result(NVIDIA3) == "ENOENT"
        assert other.open_result(NVIDIA3) == "ENXIO"

        deleted = api.delete(f"{GPUMOUNTS}/nb2", params={"device": "0"})
        assert deleted.status_code == 200, deleted.text
        assert deleted.json()["status"]["unmounted"] == [GPU0.uuid]
        assert other.open_result(NVIDIA3) == "ENOENT"
        assert keys(api.get(f"{GPUMOUNTS}/nb2").json()["status"]) == []

    assert cluster.events("GPUMounted") and cluster.events("GPUUnmounted")
    audit = backend.agent.log.read_text()
    assert "allow user=alice via=front-proxy verb=create pod=default/nb" in audit
    assert "allow user=alice via=front-proxy verb=delete pod=default/nb2" in audit


def test_bob_and_strangers_through_the_api_server(
    cluster: Cluster, backend: AggregatedAgent
) -> None:
    nb = cluster.pod("nb")
    with cluster.api(BOB) as bob:
        refused = bob.post(GPUMOUNTS, json=gpumount("nb", devices=["0"]))
        assert refused.status_code == 403, refused.text
        assert refused.json()["reason"] == "Forbidden"
        assert bob.get(f"{GPUMOUNTS}/nb").status_code == 403
        assert bob.delete(f"{GPUMOUNTS}/nb").status_code == 403
    with cluster.api() as anonymous:
        unauthenticated = anonymous.post(GPUMOUNTS, json=gpumount("nb", devices=["0"]))
        assert unauthenticated.status_code == 401
        assert unauthenticated.json()["reason"] == "Unauthorized"
    with cluster.api("not-a-token") as stranger:
        assert stranger.get(f"{GPUMOUNTS}/nb").status_code == 401
    assert nb.open_result(NVIDIA3) == "ENOENT"


def test_agent_authorizes_what_the_api_server_let_through(
    cluster: Cluster, backend: AggregatedAgent
) -> None:
    """The API server's RBAC lets bob reach the agent; the agent's own SAR still says no.

    (Here the API server is told to allow bob, as a too-broad aggregated-API rule would;
    the agent asks its own question, for the pod, and refuses.)
    """
    nb = cluster.pod("nb")
    cluster.kube.add_token("carol-token", "carol", [])
    # carol may create gpumounts in default per the API server... but only for pod "other"
    cluster.kube.allow(
        AccessRule(
            user="carol",
            api_group="hotmount.io",
            resource="gpumounts",
            namespace="default",
            name="other",
        )
    )
    cluster.kube.allow(
        AccessRule(
            user="carol",
            verb="create",
            api_group="hotmount.io",
            resource="gpumounts",
            namespace="default",
            name="",
        )
    )
    with cluster.api("carol-token") as carol:
        refused = carol.post(GPUMOUNTS, json=gpumount("nb", devices=["0"]))
    assert refused.status_code == 403, refused.text
    body = refused.json()
    assert body["reason"] == "Forbidden" and body["kind"] == "Status"
    assert "default/nb" in body["message"]  # the agent's wording, not the API server's
    assert nb.open_result(NVIDIA3) == "ENOENT"
    assert "deny user=carol via=front-proxy verb=create pod=default/nb" in (
        backend.agent.log.read_text()
    )


def test_suspension_progress_through_the_api_server(
    cluster: Cluster, backend: AggregatedAgent
) -> None:
    """GET on gpumounts/{pod}/suspend and /resume (polled while the POST runs): through the
    API server's proxy as one GPUMount object, for dana (the shipped hotmount-user in
    `default`); erin, whom the API server lets `get` the subresources but who may not
    suspend or resume nb, is refused by the agent."""
    cluster.pod("nb")
    with cluster.api(DANA) as api:
        for verb in ("suspend", "resume"):
            answer = api.get(f"{GPUMOUNTS}/nb/{verb}")
            assert answer.status_code == 200, answer.text
            obj = answer.json()
            assert (obj["kind"], obj["metadata"]["name"]) == ("GPUMount", "nb")
            assert obj["status"]["op"] == verb and obj["status"]["running"] is False
    cluster.kube.add_token("erin-token", "erin", [])
    for sub in ("suspend", "resume"):
        cluster.kube.allow(
            AccessRule(
                user="erin",
                verb="get",
                api_group="hotmount.io",
                resource=f"gpumounts/{sub}",
                namespace="default",
            )
        )
    with cluster.api("erin-token") as erin:
        for verb, asked in (("suspend", "delete"), ("resume", "create")):
            refused = erin.get(f"{GPUMOUNTS}/nb/{verb}")
            assert refused.status_code == 403, refused.text
            assert f"deny user=erin via=front-proxy verb={asked} pod=default/nb" in (
                backend.agent.log.read_text()
            )


def test_direct_to_the_tls_agent_without_client_cert(
    cluster: Cluster, backend: AggregatedAgent
) -> None:
    nb = cluster.pod("nb")
    with backend.client() as direct:
        refused = direct.post(
            GPUMOUNTS,
            json=gpumount("nb", devices=["0"]),
            headers={"x-remote-user": "alice", "x-remote-group": "ml"},
        )
        assert refused.status_code == 401, refused.text
        assert refused.json()["reason"] == "Unauthorized"
        assert direct.get(V1ALPHA1).status_code == 401
    assert nb.open_result(NVIDIA3) == "ENOENT"


def test_agent_without_front_proxy_trust_refuses_remote_headers(cluster: Cluster) -> None:
    """No requestheader CA in the ConfigMap: the aggregated API answers 401, never trusts."""
    nb = cluster.pod("nb")
    serving = CertificateAuthority(cluster.workdir / "lone", "lone-ca").issue_server("agent")
    agent = cluster.agent(tls=serving)
    with httpx.Client(base_url=agent.url, verify=agent.verify, timeout=60) as direct:
        refused = direct.post(
            GPUMOUNTS, json=gpumount("nb", devices=["0"]), headers={"x-remote-user": "alice"}
        )
    assert refused.status_code == 401, refused.text
    assert nb.open_result(NVIDIA3) == "ENOENT"


def test_sigterm_with_the_api_servers_idle_connection_open(
    cluster: Cluster, backend: AggregatedAgent
) -> None:
    """The API server keeps its TLS connection to the agent alive; SIGTERM must not wait on
    it (a graceful TLS close needs the idle peer's close_notify, which never comes)."""
    with cluster.api(ALICE) as api:
        assert api.get(V1ALPHA1).status_code == 200  # the proxy's pooled connection stays
    # Exited, not killed, and the idle connection dropped at once rather than waited on
    # (asyncio's 30 s TLS shutdown timeout). No bound in seconds: a loaded machine is slow
    # to exit, not wrong (a cold CI run at load 9 took over 25 s).
    backend.agent.stop(grace=90)
    assert backend.agent.process.returncode == 0
    dropped = backend.agent.messages("agent.http.server")
    assert any(m.startswith("shutdown: dropped an idle TLS connection") for m in dropped)
