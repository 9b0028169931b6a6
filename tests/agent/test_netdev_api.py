"""Network interfaces over HTTP: a real agent moves real veth ends into runc pods."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from tests.agent.conftest import ALICE, Cluster
from tests.support.agent import GPUS
from tests.support.netdevs import make_primary, veth_pair
from tests.support.sysfs import NICS, build_sysfs

pytestmark = pytest.mark.kernel
PODS = "/v1/namespaces/default/pods/nb/devices"


def link(name: str, pid: int | None = None) -> dict[str, object] | None:
    enter = ["nsenter", "-t", str(pid), "-n"] if pid else []
    shown = subprocess.run(
        [*enter, "ip", "-j", "addr", "show", "dev", name],
        capture_output=True,
        text=True,
        check=False,
    )
    return json.loads(shown.stdout)[0] if shown.returncode == 0 else None


@pytest.fixture
def veth() -> Iterator[str]:
    with veth_pair() as (end, _peer):
        yield end


@pytest.fixture
def sys_root(tmp_path: Path, veth: str) -> Path:
    # mlx5_0 (nearest GPU 0) has the veth end as its own network interface.
    return build_sysfs(tmp_path / "sys-root", (replace(NICS[0], netdev=veth),))


def test_with_rdma_and_with_netdev_move_the_nics_interface_and_give_it_back(
    cluster: Cluster, sys_root: Path, veth: str
) -> None:
    container = cluster.pod("nb")
    allow = ["--netdev-allow", veth[:-1] + "*"]
    agent = cluster.agent(extra=["--sys-root", str(sys_root), *allow])
    with agent.client(ALICE) as api:
        body = {"devices": ["0"], "withRdma": True, "withNetdev": True}
        mounted = api.post(PODS, json=body)

        assert mounted.status_code == 200, mounted.text
        assert mounted.json()["netdevs"] == [veth]
        assert [d["key"] for d in mounted.json()["mounted"]] == [GPUS[0].uuid, "rdma/mlx5_0"]
        assert link("net1", pid=container.pid) is not None and link(veth) is None

        unmounted = api.delete(f"{PODS}/0")

        assert unmounted.status_code == 200, unmounted.text
        assert unmounted.json()["netdevs"] == [veth]
        assert link(veth) is not None and link("net1", pid=container.pid) is None


def test_a_named_interface_with_mtu_and_addresses(
    cluster: Cluster, sys_root: Path, veth: str
) -> None:
    container = cluster.pod("nb")
    agent = cluster.agent(extra=["--netdev-allow", veth, "--netdev-address-cidr", "10.66.0.0/24"])
    with agent.client(ALICE) as api:
        netdev_body = {"name": veth, "inside": "hpc0", "mtu": 1280, "addresses": ["10.66.0.2/24"]}
        mounted = api.post(PODS, json={"devices": ["1"], "netdev": netdev_body})

        assert mounted.status_code == 200, mounted.text
        inside = link("hpc0", pid=container.pid)
        assert inside is not None and inside["mtu"] == 1280
        assert [a["local"] for a in inside["addr_info"] if a["family"] == "inet"] == ["10.66.0.2"]


@pytest.fixture
def fake_primary() -> Iterator[str]:
    """Never the node's own uplink: were the check broken, this agent would move it."""
    with veth_pair() as pair:
        yield make_primary(pair)  # tests/support/netdevs.py


def test_the_primary_interface_is_refused_even_when_everything_is_allowed(
    cluster: Cluster, fake_primary: str
) -> None:
    primary = fake_primary
    container = cluster.pod("nb")
    agent = cluster.agent(extra=["--netdev-allow", "*"])
    with agent.client(ALICE) as api:
        refused = api.post(PODS, json={"devices": ["0"], "netdev": {"name": primary}})

        assert refused.status_code == 400, refused.text
        assert refused.json()["reason"] == "NetdevRefused"
        assert "primary" in refused.json()["message"]
        assert f"nvidia{GPUS[0].minor}" not in container.ls_dev()
    assert link(primary) is not None


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ({"devices": ["0"], "withNetdev": True}, "add withRdma or rdma"),
        ({"count": 1, "netdev": {"name": "x"}}, "not with count"),
        ({"devices": ["0"], "netdev": {"name": "a/b"}}, "netdev.name"),
        ({"devices": ["0"], "netdev": {"name": "x", "addresses": ["10.0.0.1"]}}, "addresses"),
        ({"devices": ["0"], "netdev": {"name": "x", "mtu": 20}}, "mtu"),
        ({"devices": ["0"], "containers": ["*"], "netdev": {"name": "x"}}, "one container"),
        ({"devices": ["0"], "netdev": {"name": "x", "extra": 1}}, "extra"),
    ],
    ids=["no-nic", "count", "bad-name", "no-prefix", "tiny-mtu", "all-containers", "typo"],
)
def test_bad_netdev_requests_are_422(cluster: Cluster, body: dict[str, object], words: str) -> None:
    container = cluster.pod("nb")
    agent = cluster.agent(extra=["--netdev-allow", "hm*"])
    with agent.client(ALICE) as api:
        refused = api.post(PODS, json=body)

        assert refused.status_code == 422, refused.text
        assert words in refused.json()["message"]
        assert f"nvidia{GPUS[0].minor}" not in container.ls_dev()


def test_off_without_an_allow_list(cluster: Cluster, veth: str) -> None:
    cluster.pod("nb")
    agent = cluster.agent()
    with agent.client(ALICE) as api:
        refused = api.post(PODS, json={"devices": ["0"], "netdev": {"name": veth}})

        assert refused.status_code == 400 and "--netdev-allow" in refused.json()["message"]
    assert link(veth) is not None


@pytest.mark.parametrize(
    ("flags", "address", "words"),
    [
        ([], "10.66.0.2/24", "no --netdev-address-cidr"),
        (["--netdev-address-cidr", "10.66.0.0/24"], "10.67.0.2/24", "outside the CIDRs"),
        (["--netdev-address-cidr", "10.66.0.0/24"], "10.66.0.9/24", "held by the node"),
    ],
    ids=["default-none", "outside", "node-held"],
)
def test_an_address_the_operator_did_not_allow_is_400_and_nothing_moves(
    cluster: Cluster, flags: list[str], address: str, words: str
) -> None:
    """The node holds 10.66.0.9 (on the peer of the veth asked for): a pod would take it."""
    container = cluster.pod("nb")
    with veth_pair() as (end, peer):
        subprocess.run(["ip", "addr", "add", "10.66.0.9/24", "dev", peer], check=True)
        agent = cluster.agent(extra=["--netdev-allow", end, *flags])
        with agent.client(ALICE) as api:
            body = {"devices": ["0"], "netdev": {"name": end, "addresses": [address]}}
            refused = api.post(PODS, json=body)

            assert refused.status_code == 400, refused.text
            assert refused.json()["reason"] == "NetdevRefused"
            assert words in refused.json()["message"]
            assert f"nvidia{GPUS[0].minor}" not in container.ls_dev()
        assert link(end) is not None and link("net1", pid=container.pid) is None


def test_with_netdev_refuses_a_nic_interface_that_carries_the_nodes_traffic(
    cluster: Cluster, sys_root: Path, veth: str
) -> None:
    """The PF withNetdev picks holds a node address (a RoCE storage network): refused, and
    the error says why; neither the GPU nor the NIC is mounted."""
    subprocess.run(["ip", "addr", "add", "10.68.0.1/24", "dev", veth], check=True)
    container = cluster.pod("nb")
    agent = cluster.agent(extra=["--sys-root", str(sys_root), "--netdev-allow", veth[:-1] + "*"])
    with agent.client(ALICE) as api:
        body = {"devices": ["0"], "withRdma": True, "withNetdev": True}
        refused = api.post(PODS, json=body)

        assert refused.status_code == 400, refused.text
        message = refused.json()["message"]
        assert "withNetdev" in message and "carry the node's traffic" in message
        assert "address 10.68.0.1/24" in message
        assert f"nvidia{GPUS[0].minor}" not in container.ls_dev()
    assert link(veth) is not None and link("net1", pid=container.pid) is None
