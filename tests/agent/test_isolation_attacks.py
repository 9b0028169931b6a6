"""A hostile namespace editor against issue 8's guarantees, over HTTP to a real agent.

Each test is one way a tenant could reach a GPU that another tenant's pod holds;
each failed before its fix.
"""

from __future__ import annotations

import shutil
import tempfile
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.agent.conftest import AGENT_TOKEN, DANA, OLGA, Cluster
from tests.agent.test_holder_leaks import after_two_reconciles, eventually
from tests.fakes.kube_apiserver import AccessRule
from tests.fakes.podresources_server import FakePodResourcesServer
from tests.support.agent import GPUS, AgentProcess, pod_manifest

pytestmark = pytest.mark.kernel
GPU0 = GPUS[0]


def mount(api: Any, pod: str, namespace: str = "default", **body: Any) -> Any:
    return api.post(f"/v1/namespaces/{namespace}/pods/{pod}/devices", json=body)


def dana_mounts_one_by_count(agent: AgentProcess) -> tuple[dict[str, Any], str]:
    """dana mounts one GPU by count into default/nb: the reply, and the GPU's node name."""
    with agent.client(DANA) as api:
        mounted = mount(api, "nb", count=1)
    assert mounted.status_code == 200, mounted.text
    body = mounted.json()
    return body, f"nvidia{GPUS[body['mounted'][0]['index']].minor}"


def test_the_kubelet_check_fails_closed_when_podresources_does_not_answer(
    cluster: Cluster,
) -> None:
    """The kubelet gave GPU 0 to another tenant's pod; PodResources stops answering (a
    kubelet restart, its rate limit). A mount by name must not slip through unchecked."""
    nb = cluster.pod("nb")
    cluster.pod("trainer", namespace="team-b")
    kubelet = cluster.kubelets["node-a"]
    kubelet.set_allocation("team-b", "trainer", "main", "nvidia.com/gpu", [GPU0.uuid])
    agent = cluster.agent()
    with agent.client(DANA) as api:
        assert mount(api, "nb", devices=["0"]).json()["reason"] == "AllocatedToPod"
        kubelet.stop()

        refused = mount(api, "nb", devices=["0"])

        assert refused.status_code == 502, refused.text
        assert refused.json()["reason"] == "UpstreamError"
        assert "PodResources" in refused.json()["message"]
        assert f"nvidia{GPU0.minor}" not in nb.ls_dev()


def test_an_agent_started_before_the_kubelet_socket_still_checks_the_kubelet(
    cluster: Cluster, tmp_path: Path
) -> None:
    """The agent starts while the kubelet restarts (no PodResources socket yet). It must
    not serve for life as if the kubelet had given no GPU to anyone."""
    nb = cluster.pod("nb")
    cluster.pod("trainer", namespace="team-b")
    socket_dir = Path(tempfile.mkdtemp(prefix="podres-late-"))
    socket_path = str(socket_dir / "kubelet.sock")
    agent = cluster.agent(extra=["--podresources-socket", socket_path])
    with agent.client(DANA) as api:
        before = mount(api, "nb", devices=["0"])
        assert before.status_code == 502, before.text  # no kubelet to ask: fail closed

        with FakePodResourcesServer(socket_path) as kubelet:
            kubelet.set_allocation("team-b", "trainer", "main", "nvidia.com/gpu", [GPU0.uuid])
            refused = mount(api, "nb", devices=["0"])

    shutil.rmtree(socket_dir, ignore_errors=True)
    assert refused.status_code == 409, refused.text
    assert refused.json()["reason"] == "AllocatedToPod"
    assert f"nvidia{GPU0.minor}" not in nb.ls_dev()


def test_a_move_keeps_the_gpu_pinned_so_another_tenant_cannot_take_it_midway(
    cluster: Cluster,
) -> None:
    """A move takes GPU 0 out of `src`; before it lands in `dst`, another tenant tries to
    mount it. The pin never lets go during the move (it is handed over, not deleted and
    made anew), so the other tenant is refused, and the move lands."""
    src = cluster.pod("src")
    dst = cluster.pod("dst")
    other = cluster.pod("other", namespace="team-b")
    agent = cluster.agent(extra=["--kube-timeout", "600"])
    with agent.client(DANA) as dana:
        assert mount(dana, "src", devices=["0"]).status_code == 200
    # The move's unmount records an event: hold it there, between the unmount and the mount.
    stall = cluster.kube.stall(verb="create", resource="events")
    answers: dict[str, httpx.Response] = {}

    def call(name: str, token: str, path: str, body: dict[str, Any]) -> None:
        with agent.client(token) as api:
            answers[name] = api.post(path, json=body)

    move = {"device": "0", "from": {"namespace": "default", "pod": "src"}}
    move["to"] = {"namespace": "default", "pod": "dst"}
    mover = threading.Thread(target=call, args=("move", DANA, "/v1/reassign", move))
    mover.start()
    try:
        assert stall.wait_arrived(1)  # GPU 0 has left src, and is not in dst yet
        call("take", OLGA, "/v1/namespaces/team-b/pods/other/devices", {"devices": ["0"]})
    finally:
        stall.release()
        mover.join()

    taken = answers["take"]
    assert taken.status_code == 409, taken.text
    assert "cannot be pinned" in taken.json()["message"], taken.text
    assert answers["move"].status_code == 200, answers["move"].text
    assert f"nvidia{GPU0.minor}" not in other.ls_dev()
    assert f"nvidia{GPU0.minor}" not in src.ls_dev()
    assert f"nvidia{GPU0.minor}" in dst.ls_dev()
    with agent.client(OLGA) as olga:
        holders = devices_of(olga)[GPU0.uuid]["holders"]
    assert [(h["namespace"], h["pod"]) for h in holders] == [("default", "dst")]
    assert holders[0]["pin"].startswith("hotmount-pin-src-")  # the same pin, handed over


def devices_of(api: Any) -> dict[str, dict[str, Any]]:
    return {d["key"]: d for d in api.get("/v1/devices").json()["devices"]}


def test_relabelling_a_holder_pod_does_not_get_it_collected(cluster: Cluster) -> None:
    """A tenant may edit the labels of its namespace's pods, the holder pod of a count
    mount included. Pointing its holder-for label at another pod must not make reconcile
    take it for an orphan: deleting it would free the GPU in the kubelet's books while
    the tenant's container still has it, for the scheduler to give another tenant."""
    nb = cluster.pod("nb")
    agent = cluster.agent(extra=["--holder-orphan-grace", "0"])
    holder = dana_mounts_one_by_count(agent)[0]["holderPod"]
    pod = cluster.kube.pod("default", holder)
    assert pod is not None
    pod["metadata"]["labels"]["hotmount.io/holder-for"] = "someone-else"
    cluster.kube.put_pod(pod)

    after_two_reconciles(agent)

    assert cluster.kube.pod("default", holder) is not None
    assert cluster.kube.free_devices("node-a") == [GPUS[1].uuid]
    assert f"nvidia{GPU0.minor}" in nb.ls_dev() or f"nvidia{GPUS[1].minor}" in nb.ls_dev()


def test_deleting_its_holder_pod_takes_the_gpu_back(cluster: Cluster) -> None:
    """A namespace editor may delete its own holder pod: the kubelet then counts the GPU
    free, and the scheduler may give it to another tenant's pod, while the container
    still has it. Reconcile takes the GPU back: the books are right again."""
    nb = cluster.pod("nb")
    cluster.kube.allow(AccessRule(user="dana", resource="pods", namespace="default"))
    agent = cluster.agent(extra=["--holder-orphan-grace", "0"])
    body, node = dana_mounts_one_by_count(agent)
    assert node in nb.ls_dev()
    with cluster.api(DANA) as kube:
        path = f"/api/v1/namespaces/default/pods/{body['holderPod']}"
        assert kube.delete(path, params={"gracePeriodSeconds": 0}).status_code == 200

    eventually(lambda: node not in nb.ls_dev(), "take the GPU back")
    with agent.client(DANA) as api:
        assert api.get("/v1/namespaces/default/pods/nb/devices").json()["containers"] == []
    assert sorted(cluster.kube.free_devices("node-a")) == sorted(g.uuid for g in GPUS)
    # never silently: the pod is told why its GPU went
    eventually(lambda: cluster.events("GPUTakenBack") != [], "tell the pod")
    [told] = cluster.events("GPUTakenBack")
    assert told["involvedObject"]["name"] == "nb" and told["type"] == "Warning"
    assert body["holderPod"] in told["message"]


def test_a_pod_of_the_same_name_does_not_stand_in_for_a_deleted_holder(
    cluster: Cluster,
) -> None:
    """The tenant deletes its holder pod and at once creates another pod of the same name
    (labels and all) that asks for no GPU. The kubelet counts the GPU free; reconcile
    must see through the name (the uid differs) and take the GPU back."""
    nb = cluster.pod("nb")
    agent = cluster.agent(extra=["--holder-orphan-grace", "3600"])
    body, node = dana_mounts_one_by_count(agent)
    holder = cluster.kube.pod("default", body["holderPod"])
    assert holder is not None
    with cluster.api(AGENT_TOKEN) as kube:  # as the tenant would, with its edit rights
        path = f"/api/v1/namespaces/default/pods/{body['holderPod']}"
        assert kube.delete(path, params={"gracePeriodSeconds": 0}).status_code == 200
    impostor = pod_manifest(body["holderPod"], None)
    impostor["metadata"]["labels"] = holder["metadata"]["labels"]
    impostor["status"]["phase"] = "Running"
    cluster.kube.put_pod(impostor)

    eventually(lambda: node not in nb.ls_dev(), "take the GPU back")
    assert sorted(cluster.kube.free_devices("node-a")) == sorted(g.uuid for g in GPUS)
