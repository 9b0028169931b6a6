"""RDMA over HTTP: a real agent with a fixture sysfs (two NICs), real runc containers."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.agent.conftest import ALICE, Cluster
from tests.agent.test_holder_leaks import after_two_reconciles
from tests.support.agent import GPUS
from tests.support.sysfs import NICS, FixtureNic, add_nic, build_sysfs

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


# Real plugins' IDs. The SR-IOV network device plugin names each device of a pool by its
# PCI address; the RDMA shared device plugin advertises "0".."rdmaHcaMax-1" for a resource
# that gives every pod its HCAs. Both reach the agent through the fake kubelet's gRPC.
SRIOV = "nvidia.com/sriov_rdma_vf"
SHARED = "rdma/hca_shared_devices_a"
VF = FixtureNic(
    "mlx5_3",
    ("pci0000:00", "0000:00:01.0", "0000:01:00.0", "0000:02:01.0", "0000:19:00.2"),
    0,
    3,
    "ens1f0v0",
)


@pytest.mark.parametrize(
    ("body", "device_id", "nic"),
    [
        ({"devices": ["0"], "withRdma": True}, "0000:19:00.0", "rdma/mlx5_0"),  # a PF
        ({"devices": ["0"], "rdma": ["rdma/mlx5_3"]}, "0000:19:00.2", "rdma/mlx5_3"),  # a VF
    ],
    ids=["pf-with-rdma", "vf-named"],
)
def test_an_rdma_function_the_kubelet_gave_another_pod_by_pci_address_is_refused(
    cluster: Cluster, sys_root: Path, body: dict[str, object], device_id: str, nic: str
) -> None:
    """The attack: the SR-IOV plugin gave team-b's pod a function by its PCI address, the
    only form it emits. A tenant must not take that function's uverbs device along with
    a GPU, with no flag telling the agent what the resource is."""
    if nic == f"rdma/{VF.name}":
        add_nic(sys_root, VF)
    container = cluster.pod("nb")
    cluster.pod("trainer", namespace="team-b")
    cluster.kubelets["node-a"].set_allocation("team-b", "trainer", "main", SRIOV, [device_id])
    agent = cluster.agent(extra=["--sys-root", str(sys_root)])
    with agent.client(ALICE) as api:
        refused = api.post(PODS, json=body)

        assert refused.status_code == 409, refused.text
        assert refused.json()["reason"] == "AllocatedToPod"
        assert "team-b/trainer" in refused.json()["message"]
        assert device_id in refused.json()["message"] and nic in refused.json()["message"]
        assert container.exec("ls", "/dev/infiniband").stdout.split() == []
        assert api.get(PODS).json()["containers"] == []
        holders = {d["key"]: d["holders"] for d in api.get("/v1/devices").json()["devices"]}
        assert [(h["pod"], h["device"]) for h in holders[nic]] == [("trainer", device_id)]


@pytest.mark.parametrize(
    "flag",
    [f"{SHARED}=ens1f0", f"{SHARED}=0000:19:00.0,rdma/mlx5_0", SHARED, f"{SHARED}=ens9f9"],
    ids=["by-interface", "by-pci-and-name", "every-hca", "unknown-hca-means-every-one"],
)
def test_a_shared_rdma_resource_gives_its_hca_only_to_its_own_pods(
    cluster: Cluster, sys_root: Path, flag: str
) -> None:
    """team-b's pod got the shared resource (ID "0"). Its HCA is the resource's as a whole:
    a pod the kubelet did not give the resource must not hot-mount it, and one it gave the
    resource may (it has the HCA already). The ID "0" is no GPU index."""
    nb = cluster.pod("nb")
    member = cluster.pod("member")
    cluster.pod("trainer", namespace="team-b")
    kubelet = cluster.kubelets["node-a"]
    kubelet.set_allocation("team-b", "trainer", "main", SHARED, ["0"])
    kubelet.set_allocation("default", "member", "main", SHARED, ["1"])
    agent = cluster.agent(extra=["--sys-root", str(sys_root), "--rdma-shared-resource", flag])
    with agent.client(ALICE) as api:
        for body in (
            {"devices": ["0"], "withRdma": True},
            {"devices": ["1"], "rdma": ["rdma/mlx5_0"]},
        ):
            refused = api.post(PODS, json=body)

            assert refused.status_code == 409, refused.text
            assert refused.json()["reason"] == "AllocatedToPod"
            assert SHARED in refused.json()["message"]
            assert refused.json()["details"]["pods"] == ["default/member", "team-b/trainer"]
            assert nb.exec("ls", "/dev/infiniband").stdout.split() == []

        gpu_only = api.post(PODS, json={"devices": ["0"]})  # "0" of the shared resource

        assert gpu_only.status_code == 200, gpu_only.text
        assert f"nvidia{GPUS[0].minor}" in nb.ls_dev()

        joined = api.post(
            "/v1/namespaces/default/pods/member/devices",
            json={"devices": ["1"], "withRdma": True},
        )

        assert joined.status_code == 200, joined.text
        assert "rdma/mlx5_0" in [d["key"] for d in joined.json()["mounted"]]
        assert member.open_result("/dev/infiniband/uverbs0") == "ENXIO"
    # team-b's pod holds the same HCA through the same resource: no double booking.
    after_two_reconciles(agent)
    assert member.open_result("/dev/infiniband/uverbs0") == "ENXIO"
    assert cluster.events("GPUDoubleBooked") == []


def test_a_shared_rdma_resource_leaves_the_hcas_it_does_not_cover_alone(
    cluster: Cluster, sys_root: Path
) -> None:
    nb = cluster.pod("nb")
    cluster.pod("trainer", namespace="team-b")
    cluster.kubelets["node-a"].set_allocation("team-b", "trainer", "main", SHARED, ["0"])
    agent = cluster.agent(
        extra=["--sys-root", str(sys_root), "--rdma-shared-resource", f"{SHARED}=rdma/mlx5_1"]
    )
    with agent.client(ALICE) as api:
        mounted = api.post(PODS, json={"devices": ["0"], "withRdma": True})

        assert mounted.status_code == 200, mounted.text
        assert [d["key"] for d in mounted.json()["mounted"]] == [GPUS[0].uuid, "rdma/mlx5_0"]
        assert nb.open_result("/dev/infiniband/uverbs0") == "ENXIO"


def test_an_rdma_resource_id_that_maps_to_no_nic_refuses_rdma_mounts_only(
    cluster: Cluster, sys_root: Path
) -> None:
    """Fail closed: the kubelet gave team-b a function of an RDMA pool that the inventory
    cannot name (it could be any NIC), so no RDMA device is mounted until it can. GPUs,
    and IDs of resources nobody declared RDMA (CPU cores, here), are not held up."""
    nb = cluster.pod("nb")
    cluster.pod("trainer", namespace="team-b")
    kubelet = cluster.kubelets["node-a"]
    kubelet.set_allocation("team-b", "trainer", "main", SRIOV, ["0000:19:00.0", "0000:5e:00.3"])
    kubelet.set_allocation("team-b", "trainer", "main", "example.com/cpu-pinning", ["core-7"])
    agent = cluster.agent(extra=["--sys-root", str(sys_root), "--rdma-resource", SRIOV])
    with agent.client(ALICE) as api:
        refused = api.post(PODS, json={"devices": ["1"], "rdma": ["rdma/mlx5_1"]})

        assert refused.status_code == 409, refused.text
        message = refused.json()["message"]
        assert SRIOV in message and "0000:5e:00.3" in message and "team-b/trainer" in message
        assert refused.json()["details"]["unmapped"] == ["0000:5e:00.3"]
        assert nb.exec("ls", "/dev/infiniband").stdout.split() == []
        assert api.get(PODS).json()["containers"] == []

        gpu_only = api.post(PODS, json={"devices": ["1"]})

        assert gpu_only.status_code == 200, gpu_only.text

        kubelet.set_allocation("team-b", "trainer", "main", SRIOV, ["0000:19:00.0"])
        mapped = api.post(PODS, json={"devices": ["1"], "rdma": ["rdma/mlx5_1"]})

        assert mapped.status_code == 200, mapped.text
        assert nb.open_result("/dev/infiniband/uverbs1") == "ENXIO"
