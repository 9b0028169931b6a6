"""RDMA over HTTP: a real agent with a fixture sysfs (two NICs), real runc containers."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.agent.conftest import ALICE, Cluster
from tests.support.agent import GPUS
from tests.support.sysfs import NICS, build_sysfs

pytestmark = pytest.mark.kernel
PODS = "/v1/namespaces/default/pods/nb/devices"


@pytest.fixture
def sys_root(tmp_path: Path) -> Path:
    # GPU 0 (0000:18:00.0) shares mlx5_0's PCIe switch, GPU 1 (0000:3b:00.0) its host bridge.
    return build_sysfs(tmp_path / "sys-root", NICS[:2])


def test_with_rdma_over_http_and_the_device_list(cluster: Cluster, sys_root: Path) -> None:
    container = cluster.pod("nb")
    agent = cluster.agent(extra=["--sys-root", str(sys_root)])
    with agent.client(ALICE) as api:
        listed = {d["key"]: d for d in api.get("/v1/devices").json()["devices"]}
        nic = listed["rdma/mlx5_0"]
        assert nic["kind"] == "rdma" and nic["pciBusId"] == "0000:19:00.0"
        assert nic["nearestGpus"] == [GPUS[0].uuid, GPUS[1].uuid]
        assert nic["netdevs"] == ["ens1f0"] and nic["numaNode"] == 0
        assert nic["nodes"] == ["/dev/infiniband/uverbs0"]
        assert listed["rdma/mlx5_1"]["nearestGpus"] == []
        assert listed[GPUS[0].uuid]["nearestRdma"] == "rdma/mlx5_0"

        mounted = api.post(PODS, json={"devices": ["0"], "withRdma": True})

        assert mounted.status_code == 200, mounted.text
        assert [d["key"] for d in mounted.json()["mounted"]] == [GPUS[0].uuid, "rdma/mlx5_0"]
        assert container.open_result("/dev/infiniband/uverbs0") == "ENXIO"
        holders = {d["key"]: d["holders"] for d in api.get("/v1/devices").json()["devices"]}
        assert holders["rdma/mlx5_0"][0]["pod"] == "nb"

        unmounted = api.delete(f"{PODS}/0")

        assert unmounted.status_code == 200, unmounted.text
        assert sorted(unmounted.json()["unmounted"]) == sorted([GPUS[0].uuid, "rdma/mlx5_0"])
        assert container.exec("ls", "/dev/infiniband").stdout.split() == []


@pytest.mark.parametrize(
    ("body", "code", "words"),
    [
        ({"devices": ["0"], "rdma": ["231:192"]}, 400, "raw major:minor"),
        ({"devices": ["0"], "rdma": ["1"]}, 400, "not an RDMA device"),
        ({"devices": ["0"], "rdma": ["rdma/mlx5_7"]}, 404, "not in this node's inventory"),
        ({"count": 1, "withRdma": True}, 422, "not with count"),
        ({"devices": ["0"], "withRdma": "yes please"}, 422, "withRdma"),
    ],
    ids=["raw-number", "a-gpu", "unknown", "with-count", "not-a-bool"],
)
def test_bad_rdma_requests_change_nothing(
    cluster: Cluster, sys_root: Path, body: dict[str, object], code: int, words: str
) -> None:
    container = cluster.pod("nb")
    agent = cluster.agent(extra=["--sys-root", str(sys_root)])
    with agent.client(ALICE) as api:
        refused = api.post(PODS, json=body)

        assert refused.status_code == code, refused.text
        assert refused.json()["kind"] == "Status" and words in refused.json()["message"]
        assert f"nvidia{GPUS[0].minor}" not in container.ls_dev()
        assert api.get(PODS).json()["containers"] == []


@pytest.mark.parametrize(
    "body", [{"devices": ["0"], "withRdma": True}, {"devices": ["0"], "rdma": ["rdma/mlx5_0"]}]
)
def test_an_rdma_nic_the_kubelet_gave_another_pod_is_refused(
    cluster: Cluster, sys_root: Path, body: dict[str, object]
) -> None:
    """The kubelet gave mlx5_0 to another tenant's pod. A mount that names only GPU 0 but
    brings its NIC along (withRdma, or rdma) must not hot-mount that NIC without force."""
    container = cluster.pod("nb")
    cluster.pod("trainer", namespace="team-b")
    kubelet = cluster.kubelets["node-a"]
    kubelet.set_allocation("team-b", "trainer", "main", "rdma/hca", ["rdma/mlx5_0"])
    agent = cluster.agent(extra=["--sys-root", str(sys_root)])
    with agent.client(ALICE) as api:
        refused = api.post(PODS, json=body)

        assert refused.status_code == 409, refused.text
        assert refused.json()["reason"] == "AllocatedToPod"
        assert "team-b/trainer" in refused.json()["message"]
        assert f"nvidia{GPUS[0].minor}" not in container.ls_dev()
        assert container.exec("ls", "/dev/infiniband").stdout.split() == []
        assert api.get(PODS).json()["containers"] == []

        forced = api.post(PODS, json={**body, "force": True})

        assert forced.status_code == 200, forced.text
        assert "rdma/mlx5_0" in [d["key"] for d in forced.json()["mounted"]]
