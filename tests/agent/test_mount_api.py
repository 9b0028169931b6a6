"""Mount and unmount over HTTP: a real agent process, real runc containers, a fake cluster."""

from __future__ import annotations

import pytest

from tests.agent.conftest import ALICE, Cluster
from tests.support.agent import GPUS

pytestmark = pytest.mark.kernel
GPU0 = GPUS[0]  # index 0 is minor 3: /dev/nvidia3


@pytest.mark.parametrize(
    ("ref", "node", "key"),
    [
        ("0", f"nvidia{GPU0.minor}", GPU0.uuid),
        (GPUS[1].uuid, f"nvidia{GPUS[1].minor}", GPUS[1].uuid),
        ("nvidia.com/gpu=0", "nvidia0", "nvidia.com/gpu=0"),
    ],
    ids=["index", "uuid", "cdi-name"],
)
def test_mount_then_unmount(cluster: Cluster, ref: str, node: str, key: str) -> None:
    container = cluster.pod("nb")
    agent = cluster.agent()
    with agent.client(ALICE) as api:
        assert container.open_result(f"/dev/{node}") == "ENOENT"

        mounted = api.post("/v1/namespaces/default/pods/nb/devices", json={"devices": [ref]})

        assert mounted.status_code == 200, mounted.text
        body = mounted.json()
        assert [d["key"] for d in body["mounted"]] == [key]
        assert body["mounted"][0]["paths"] == [f"/dev/{node}"]
        assert body["containerId"] == container.id and body["container"] == "main"
        assert container.open_result(f"/dev/{node}") == "ENXIO"

        again = api.post("/v1/namespaces/default/pods/nb/devices", json={"devices": [ref]})
        assert again.status_code == 200 and again.json()["mounted"] == []

        status = api.get("/v1/namespaces/default/pods/nb/devices").json()
        assert [d["key"] for c in status["containers"] for d in c["devices"]] == [key]
        holders = {d["key"]: d["holder"] for d in api.get("/v1/devices").json()["devices"]}
        assert holders[key]["source"] == "hotmount" and holders[key]["pod"] == "nb"

        unmounted = api.delete(f"/v1/namespaces/default/pods/nb/devices/{ref}")

        assert unmounted.status_code == 200, unmounted.text
        assert unmounted.json()["unmounted"] == [key]
        assert node not in container.ls_dev()
    assert cluster.events("GPUMounted") and cluster.events("GPUUnmounted")


def test_busy_device_is_409_until_forced(cluster: Cluster) -> None:
    container = cluster.pod("nb")
    agent = cluster.agent()
    with agent.client(ALICE) as api:
        assert (
            api.post(
                "/v1/namespaces/default/pods/nb/devices", json={"devices": ["nvidia.com/gpu=1"]}
            ).status_code
            == 200
        )
        holder = container.hold("/dev/nvidia1")
        try:
            busy = api.delete("/v1/namespaces/default/pods/nb/devices/nvidia.com/gpu=1")
            assert busy.status_code == 409
            assert busy.json()["reason"] == "DeviceBusy"
            [held] = busy.json()["details"]["holders"]
            assert held["path"] == "/dev/nvidia1" and held["command"] in ("sh", "sleep")
            assert container.open_result("/dev/nvidia1") == "OK"

            forced = api.delete(
                "/v1/namespaces/default/pods/nb/devices/nvidia.com/gpu=1", params={"force": "true"}
            )
            assert forced.status_code == 200, forced.text
            assert forced.json()["stoppedPids"]
        finally:
            holder.kill()
            holder.communicate()


def test_device_the_kubelet_gave_another_running_pod_is_409(cluster: Cluster) -> None:
    cluster.pod("nb")
    cluster.pod("trainer")
    cluster.kubelets["node-a"].set_allocation(
        "default", "trainer", "main", "nvidia.com/gpu", [GPU0.uuid]
    )
    agent = cluster.agent()
    with agent.client(ALICE) as api:
        refused = api.post("/v1/namespaces/default/pods/nb/devices", json={"devices": ["0"]})

        assert refused.status_code == 409, refused.text
        assert refused.json()["reason"] == "AllocatedToPod"
        assert "default/trainer" in refused.json()["message"]
        holders = {d["key"]: d["holder"] for d in api.get("/v1/devices").json()["devices"]}
        assert holders[GPU0.uuid] == {
            "source": "kubelet",
            "namespace": "default",
            "pod": "trainer",
            "container": "main",
            "containerId": None,
            "device": GPU0.uuid,
            "sharedWith": None,
            "pin": None,
        }
        forced = api.post(
            "/v1/namespaces/default/pods/nb/devices", json={"devices": ["0"], "force": True}
        )
        assert forced.status_code == 200, forced.text


def test_two_pods_racing_for_one_device_one_wins(cluster: Cluster) -> None:
    from concurrent.futures import ThreadPoolExecutor

    cluster.pod("a")
    cluster.pod("b")
    agent = cluster.agent()

    def mount(pod: str) -> int:
        with agent.client(ALICE) as api:
            return api.post(
                f"/v1/namespaces/default/pods/{pod}/devices", json={"devices": ["0"]}
            ).status_code

    with ThreadPoolExecutor(2) as pool:
        codes = sorted(pool.map(mount, ["a", "b"]))

    assert codes == [200, 409]


def test_pod_on_no_node_or_not_running(cluster: Cluster) -> None:
    from tests.support.agent import pod_manifest

    cluster.kube.put_pod(pod_manifest("pending", None))
    agent = cluster.agent()
    with agent.client(ALICE) as api:
        pending = api.post("/v1/namespaces/default/pods/pending/devices", json={"devices": ["0"]})
        missing = api.post("/v1/namespaces/default/pods/ghost/devices", json={"devices": ["0"]})
    assert (pending.status_code, pending.json()["reason"]) == (409, "PodNotRunning")
    assert (missing.status_code, missing.json()["reason"]) == (404, "PodNotFound")
