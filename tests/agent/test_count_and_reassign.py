"""Mount by count with a holder pod, and reassign with its rollback."""

from __future__ import annotations

import pytest

from agent.podresources import PodResourcesClient
from tests.agent.conftest import ALICE, Cluster
from tests.support.agent import GPUS

pytestmark = pytest.mark.kernel
GPU0 = GPUS[0]
MOVE_GPU0_FROM_A_TO_B = {
    "device": "0",
    "from": {"namespace": "default", "pod": "a"},
    "to": {"namespace": "default", "pod": "b"},
}


def test_mount_by_count_keeps_the_schedulers_books(cluster: Cluster) -> None:
    container = cluster.pod("nb")
    agent = cluster.agent()
    with agent.client(ALICE) as api:
        mounted = api.post("/v1/namespaces/default/pods/nb/devices", json={"count": 1})

        assert mounted.status_code == 200, mounted.text
        body = mounted.json()
        holder = cluster.kube.pod("default", body["holderPod"])
        assert holder is not None and holder["status"]["phase"] == "Running"
        # Pinned to the node, in the target's namespace, owned (not controlled) by it.
        # By the node's own name (metadata.name), not the hostname label, which may differ.
        [term] = holder["spec"]["affinity"]["nodeAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"
        ]["nodeSelectorTerms"]
        assert term == {
            "matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-a"]}]
        }
        assert "nodeSelector" not in holder["spec"]
        # Guaranteed QoS: cpu and memory requested exactly as limited.
        resources = holder["spec"]["containers"][0]["resources"]
        assert resources["requests"] == resources["limits"]
        assert {"cpu", "memory", "nvidia.com/gpu"} <= set(resources["limits"])
        [owner] = holder["metadata"]["ownerReferences"]
        assert (owner["name"], owner["controller"]) == ("nb", False)
        assert owner["uid"] == cluster.kube.pod("default", "nb")["metadata"]["uid"]
        env = holder["spec"]["containers"][0]["env"]
        assert {"name": "NVIDIA_VISIBLE_DEVICES", "value": "none"} in env
        # Exactly the device the kubelet gave the holder was mounted.
        with PodResourcesClient(cluster.kubelets["node-a"].socket_path) as kubelet:
            [allocation] = [
                a for a in kubelet.list_allocations() if a.pod_name == body["holderPod"]
            ]
        [device] = body["mounted"]
        assert device["key"] in allocation.device_ids
        minor = next(g.minor for g in GPUS if g.uuid == device["key"])
        assert container.open_result(f"/dev/nvidia{minor}") == "ENXIO"

        unmounted = api.delete(f"/v1/namespaces/default/pods/nb/devices/{device['key']}")

        assert unmounted.status_code == 200, unmounted.text
        assert unmounted.json()["holderPodsDeleted"] == [body["holderPod"]]
        assert cluster.kube.pod("default", body["holderPod"]) is None
        assert sorted(cluster.kube.free_devices("node-a")) == sorted(g.uuid for g in GPUS)


def test_unschedulable_holder_is_409_with_the_schedulers_message(cluster: Cluster) -> None:
    container = cluster.pod("nb")
    agent = cluster.agent()
    before = container.ls_dev()
    with agent.client(ALICE) as api:
        refused = api.post("/v1/namespaces/default/pods/nb/devices", json={"count": 3})

    assert refused.status_code == 409, refused.text
    assert refused.json()["reason"] == "Unschedulable"
    assert "Insufficient nvidia.com/gpu" in refused.json()["message"]
    assert not [
        p for p in cluster.kube.pods() if p["metadata"]["name"].startswith("hotmount-holder")
    ]
    assert container.ls_dev() == before


def test_reassign_moves_the_device(cluster: Cluster) -> None:
    source, target = cluster.pod("a"), cluster.pod("b", mode="v2")
    agent = cluster.agent()
    with agent.client(ALICE) as api:
        assert (
            api.post("/v1/namespaces/default/pods/a/devices", json={"devices": ["0"]}).status_code
            == 200
        )

        moved = api.post(
            "/v1/reassign",
            json=MOVE_GPU0_FROM_A_TO_B,
        )

        assert moved.status_code == 200, moved.text
        assert moved.json()["unmounted"]["unmounted"] == [GPU0.uuid]
        assert [d["key"] for d in moved.json()["mounted"]["mounted"]] == [GPU0.uuid]
    node = f"/dev/nvidia{GPU0.minor}"
    assert source.open_result(node) == "ENOENT"
    assert target.open_result(node) == "ENXIO"
    assert len(cluster.events("GPUReassigned")) == 2


def test_reassign_rolls_back_when_the_target_fails(cluster: Cluster) -> None:
    source, target = cluster.pod("a"), cluster.pod("b")
    node = f"/dev/nvidia{GPU0.minor}"
    target.exec("sh", "-c", f"echo occupied > {node}")  # the mount into b must fail
    agent = cluster.agent()
    with agent.client(ALICE) as api:
        assert (
            api.post("/v1/namespaces/default/pods/a/devices", json={"devices": ["0"]}).status_code
            == 200
        )

        failed = api.post(
            "/v1/reassign",
            json=MOVE_GPU0_FROM_A_TO_B,
        )

        assert failed.status_code == 409, failed.text
        assert failed.json()["reason"] == "UnsafePath"
        assert "went back to its source" in failed.json()["message"]
        status = api.get("/v1/namespaces/default/pods/a/devices").json()
        assert [d["key"] for c in status["containers"] for d in c["devices"]] == [GPU0.uuid]
    assert source.open_result(node) == "ENXIO"
    assert target.exec("cat", node).stdout.strip() == "occupied"


def test_reassign_of_a_device_the_source_does_not_have_is_409(cluster: Cluster) -> None:
    cluster.pod("a")
    cluster.pod("b")
    agent = cluster.agent()
    with agent.client(ALICE) as api:
        refused = api.post(
            "/v1/reassign",
            json=MOVE_GPU0_FROM_A_TO_B,
        )
    assert (refused.status_code, refused.json()["reason"]) == (409, "NotMounted")
