"""Who may force, move and list: RBAC as the shipped ClusterRoles grant it.

dana has the shipped `hotmount-user` through a RoleBinding in `default` (what `edit`
gives a namespace's members); olga has the shipped `hotmount-admin` through a
ClusterRoleBinding. The fake API server answers the agent's SubjectAccessReviews from
those bindings, and authorizes aggregated paths by their scope before proxying, as
kube-apiserver does. Every refusal must change nothing: not the claims, not the
ledger, not the container's /dev or cgroup, not the processes holding a device.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.agent.conftest import ALICE, DANA, OLGA, AggregatedAgent, Cluster, shipped_role
from tests.support.agent import GPUS
from tests.support.runc import RuncContainer

pytestmark = pytest.mark.kernel
GPU0 = GPUS[0]
NVIDIA3 = f"/dev/nvidia{GPU0.minor}"  # index 0 is minor 3
FUSE_GPU = "nvidia.com/gpu=1"  # the CDI stand-in: /dev/nvidia1 is /dev/fuse, holdable
V1ALPHA1 = "/apis/hotmount.io/v1alpha1"
NAMESPACED = f"{V1ALPHA1}/namespaces/default"


def ledger_view(state_dir: Path) -> tuple[list[str], dict[str, Any]]:
    """The claims on disk and each container record's devices and nodes."""
    claims = sorted(p.name for p in (state_dir / "claims").glob("*") if p.is_file())
    records = {}
    for path in sorted((state_dir / "containers").glob("*.json")):
        record = json.loads(path.read_text())
        records[path.name] = (sorted(record.get("devices", {})), sorted(record.get("nodes", {})))
    return claims, records


def kernel_view(*containers: RuncContainer) -> list[tuple[list[str], str, str]]:
    return [(c.ls_dev(), c.open_result(NVIDIA3), c.open_result("/dev/nvidia1")) for c in containers]


def forbidden(response: httpx.Response, verb: str) -> str:
    assert response.status_code == 403, response.text
    body = response.json()
    assert (body["kind"], body["reason"]) == ("Status", "Forbidden")
    assert f"cannot {verb} " in body["message"], body["message"]
    return str(body["message"])


def reassignment(source: str, target: str, force: bool = False, **extra: Any) -> dict[str, Any]:
    spec = {"device": "0", "from": {"pod": source}, "to": {"pod": target}, "force": force}
    for side, namespace in extra.items():
        spec[side]["namespace"] = namespace
    return {"apiVersion": "hotmount.io/v1alpha1", "kind": "Reassignment", "spec": spec}


def test_force_is_a_permission_of_its_own_on_the_v1_api(cluster: Cluster) -> None:
    a, b = cluster.pod("a"), cluster.pod("b")
    agent = cluster.agent()
    state = cluster.workdir / "state-node-a"
    with agent.client(DANA) as dana:
        # hotmount-user mounts and moves without force ...
        assert dana.post(
            "/v1/namespaces/default/pods/a/devices", json={"devices": ["0"]}
        ).is_success
        ok = dana.post("/v1/namespaces/default/pods/a/devices", json={"devices": [FUSE_GPU]})
        assert ok.status_code == 200, ok.text
        holder = a.hold("/dev/nvidia1")
        try:
            before = ledger_view(state), kernel_view(a, b)

            # ... but every forced call is refused, and nothing moves
            takeover = dana.post(
                "/v1/namespaces/default/pods/b/devices", json={"devices": ["0"], "force": True}
            )
            message = forbidden(takeover, "force")
            assert "pod default/b" in message
            stop = dana.delete(
                f"/v1/namespaces/default/pods/a/devices/{FUSE_GPU}", params={"force": "true"}
            )
            forbidden(stop, "force")
            move = {
                "device": "0",
                "from": {"namespace": "default", "pod": "a"},
                "to": {"namespace": "default", "pod": "b"},
                "force": True,
            }
            forbidden(dana.post("/v1/reassign", json=move), "force")

            assert (ledger_view(state), kernel_view(a, b)) == before
            assert holder.poll() is None  # the process holding the device was not stopped
            assert a.open_result(NVIDIA3) == "ENXIO" and b.open_result(NVIDIA3) == "ENOENT"
        finally:
            holder.kill()
            holder.communicate()
    decisions = agent.log.read_text()
    assert "deny user=dana via=token verb=force pod=default/b" in decisions
    assert "deny user=dana via=token verb=force pod=default/a" in decisions
    assert not cluster.events("GPUReassigned")

    # hotmount-admin may: the forced move stops nobody here and moves the GPU
    with agent.client(OLGA) as olga:
        moved = olga.post("/v1/reassign", json={**move, "force": True})
        assert moved.status_code == 200, moved.text
    assert a.open_result(NVIDIA3) == "ENOENT" and b.open_result(NVIDIA3) == "ENXIO"
    assert "allow user=olga via=token verb=force pod=default/b" in agent.log.read_text()


def test_a_forced_move_needs_force_on_both_pods(cluster: Cluster) -> None:
    """force on the target alone is not enough: the source's holders would be stopped."""
    a, b = cluster.pod("a"), cluster.pod("b")
    agent = cluster.agent()
    cluster.kube.add_token("tara-token", "tara", [])
    cluster.kube.bind_role(shipped_role("hotmount-user"), user="tara", namespace="default")
    force_on_b = {
        "kind": "ClusterRole",
        "rules": [{"apiGroups": ["hotmount.io"], "resources": ["gpumounts"], "verbs": ["force"],
                   "resourceNames": ["b"]}],
    }  # fmt: skip
    cluster.kube.bind_role(force_on_b, user="tara", namespace="default")
    with agent.client("tara-token") as tara:
        assert tara.post(
            "/v1/namespaces/default/pods/a/devices", json={"devices": ["0"]}
        ).is_success
        forced_into_b = tara.post(
            "/v1/namespaces/default/pods/b/devices", json={"devices": ["1"], "force": True}
        )
        assert forced_into_b.status_code == 200, forced_into_b.text  # force on b: granted
        before = kernel_view(a, b)
        move = {
            "device": "0",
            "from": {"namespace": "default", "pod": "a"},
            "to": {"namespace": "default", "pod": "b"},
            "force": True,
        }
        assert "pod default/a" in forbidden(tara.post("/v1/reassign", json=move), "force")
    assert kernel_view(a, b) == before


def test_force_through_the_api_server(cluster: Cluster) -> None:
    """The aggregated API: the API server lets dana's forced calls through (its RBAC knows
    create and delete, not what the body says); the agent's own SAR refuses them."""
    a, b = cluster.pod("a"), cluster.pod("b")
    backend: AggregatedAgent = cluster.aggregated_agent()
    state = cluster.workdir / "state-node-a"
    mount = {"apiVersion": "hotmount.io/v1alpha1", "kind": "GPUMount"}
    with cluster.api(DANA) as dana:
        made = dana.post(
            f"{NAMESPACED}/gpumounts",
            json={**mount, "metadata": {"name": "a"}, "spec": {"devices": ["0"]}},
        )
        assert made.status_code == 201, made.text
        before = ledger_view(state), kernel_view(a, b)

        forced = {**mount, "metadata": {"name": "b"}, "spec": {"devices": ["0"], "force": True}}
        forbidden(dana.post(f"{NAMESPACED}/gpumounts", json=forced), "force")
        forbidden(
            dana.delete(f"{NAMESPACED}/gpumounts/a", params={"device": "0", "force": "true"}),
            "force",
        )
        move = reassignment("a", "b", force=True)
        forbidden(dana.post(f"{NAMESPACED}/reassignments", json=move), "force")
        assert (ledger_view(state), kernel_view(a, b)) == before
    with cluster.api(OLGA) as olga:
        moved = olga.post(f"{NAMESPACED}/reassignments", json=move)
        assert moved.status_code == 201, moved.text
    assert a.open_result(NVIDIA3) == "ENOENT" and b.open_result(NVIDIA3) == "ENXIO"
    assert "deny user=dana via=front-proxy verb=force" in backend.agent.log.read_text()


def test_a_namespaced_user_moves_a_gpu_within_their_namespace(cluster: Cluster) -> None:
    """The bug a real API server found: a cluster-scoped reassignment is refused by the API
    server itself for a user whose rights come from a RoleBinding."""
    a, b = cluster.pod("a"), cluster.pod("b")
    backend = cluster.aggregated_agent()
    with cluster.api(DANA) as dana:
        discovery = {r["name"]: r for r in dana.get(V1ALPHA1).json()["resources"]}
        assert discovery["reassignments"]["namespaced"] is True
        assert discovery["reassignments"]["verbs"] == ["create"]
        mount = {
            "apiVersion": "hotmount.io/v1alpha1",
            "kind": "GPUMount",
            "metadata": {"name": "a"},
            "spec": {"devices": ["0"]},
        }
        assert dana.post(f"{NAMESPACED}/gpumounts", json=mount).status_code == 201

        # cluster-scoped: the API server refuses before the agent sees it
        cluster_wide = dana.post(
            f"{V1ALPHA1}/reassignments",
            json=reassignment("a", "b", **{"from": "default", "to": "default"}),
        )
        assert cluster_wide.status_code == 403, cluster_wide.text
        assert "at the cluster scope" in cluster_wide.json()["message"]
        assert f'"path": "{V1ALPHA1}/reassignments"' not in backend.agent.log.read_text()
        assert a.open_result(NVIDIA3) == "ENXIO"

        # a pod of another namespace in a namespaced Reassignment: 400, says where to go
        elsewhere = dana.post(
            f"{NAMESPACED}/reassignments", json=reassignment("a", "b", to="team-b")
        )
        assert elsewhere.status_code == 400, elsewhere.text
        assert f"{V1ALPHA1}/reassignments" in elsewhere.json()["message"]
        assert a.open_result(NVIDIA3) == "ENXIO"

        moved = dana.post(f"{NAMESPACED}/reassignments", json=reassignment("a", "b"))
        assert moved.status_code == 201, moved.text
        obj = moved.json()
        assert (obj["kind"], obj["metadata"]["namespace"]) == ("Reassignment", "default")
        assert obj["spec"]["from"] == {"namespace": "default", "pod": "a"}
        assert obj["status"]["mounted"]["containerId"] == b.id
    assert a.open_result(NVIDIA3) == "ENOENT" and b.open_result(NVIDIA3) == "ENXIO"
    audit = backend.agent.log.read_text()
    assert "allow user=dana via=front-proxy verb=delete pod=default/a" in audit
    assert "allow user=dana via=front-proxy verb=create pod=default/b" in audit

    # across namespaces: the cluster-scoped path, for a ClusterRoleBinding holder
    # (authorized by both: the agent then refuses to carry the pin into another namespace,
    # whose quota it would not charge; docs/api.md, "Accounting")
    cluster.pod("c", namespace="team-b")
    with cluster.api(OLGA) as olga:
        across = olga.post(
            f"{V1ALPHA1}/reassignments",
            json=reassignment("b", "c", **{"from": "default", "to": "team-b"}),
        )
        assert across.status_code == 409, across.text
        assert across.json()["reason"] == "PinnedInNamespace", across.text
    audit = backend.agent.log.read_text()
    assert "allow user=olga via=front-proxy verb=create pod=team-b/c" in audit
    assert b.open_result(NVIDIA3) == "ENXIO"  # still b's


def test_the_agent_asks_about_nodedevices_when_listing_them(cluster: Cluster) -> None:
    """`nvcli list`: a namespaced tenant is refused by the API server naming nodedevices
    at the cluster scope; hotmount-viewer alone (no gpumounts rights) is enough."""
    cluster.pod("a")
    backend = cluster.aggregated_agent()
    cluster.kube.add_token("vic-token", "vic", [])
    cluster.kube.bind_role(shipped_role("hotmount-viewer"), user="vic")
    with cluster.api(DANA) as dana:
        refused = dana.get(f"{V1ALPHA1}/nodedevices")
        assert refused.status_code == 403, refused.text
        body = refused.json()
        assert body["details"]["kind"] == "nodedevices"
        assert "at the cluster scope" in body["message"]
    with cluster.api("vic-token") as vic:
        listed = vic.get(f"{V1ALPHA1}/nodedevices")
        assert listed.status_code == 200, listed.text
        assert [i["metadata"]["name"] for i in listed.json()["items"]] == ["node-a"]
        assert vic.get(f"{V1ALPHA1}/nodedevices/node-a").status_code == 200
        forbidden(vic.get(f"{NAMESPACED}/gpumounts/a"), "get")  # the API server's refusal
    audit = backend.agent.log.read_text()
    assert "allow user=vic via=front-proxy verb=list resource=nodedevices" in audit
    assert "allow user=vic via=front-proxy verb=get resource=nodedevices pod=node-a" in audit
    with backend.agent.client(ALICE) as direct:  # the /v1 path asks the same question
        assert direct.get("/v1/devices").status_code == 200
