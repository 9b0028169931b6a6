"""nvcli's RDMA and netdev flags (and --once): what they send, refusals before any request, and
`nvcli mount --with-rdma --with-netdev` then `nvcli list` against the real agent."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from tests.agent.conftest import ALICE
from tests.agent.conftest import Cluster as RealCluster
from tests.cli.conftest import AGENT_TOKEN, Run
from tests.cli.stub_agent import StubAgent
from tests.support.agent import GPUS as REAL_GPUS
from tests.support.netdevs import veth_pair
from tests.support.sysfs import NICS, build_sysfs

Nvcli = Callable[..., Run]
MOUNT = ["mount", "--name", "nb-0", "--mount", "0"]


def agent_args(url: str, token: str = AGENT_TOKEN, namespace: str = "ml") -> list[str]:
    return ["--agent", url, "--token", token, "-n", namespace]


BODIES = {
    "with-rdma": (["--with-rdma"], {"withRdma": True}),
    "rdma-named": (["--rdma", "rdma/mlx5_0,rdma/mlx5_1"], {"rdma": ["rdma/mlx5_0", "rdma/mlx5_1"]}),
    "with-netdev": (["--with-rdma", "--with-netdev"], {"withRdma": True, "withNetdev": True}),
    "netdev-named": (
        ["--netdev", "ens1f0v2", "--netdev-inside", "hpc0", "--netdev-mtu", "9000",
         "--netdev-address", "10.0.0.2/24", "--netdev-address", "fd00::2/64"],
        {"netdev": {"name": "ens1f0v2", "inside": "hpc0", "mtu": 9000,
                    "addresses": ["10.0.0.2/24", "fd00::2/64"]}},
    ),
    "once": (["--once"], {"once": True}),
}  # fmt: skip


@pytest.mark.parametrize(("flags", "sent"), BODIES.values(), ids=BODIES.keys())
def test_the_request_body(nvcli: Nvcli, stub: StubAgent, flags: list[str], sent: dict) -> None:
    run = nvcli(*MOUNT, *flags, *agent_args(stub.url))
    assert run.rc == 0, run.err
    (req,) = stub.received
    assert req.body == {"devices": ["0"], "force": False, **sent}


def test_without_the_flags_nothing_new_is_sent(nvcli: Nvcli, stub: StubAgent) -> None:
    """An older agent refuses fields it does not know: plain mounts must not carry them."""
    assert nvcli(*MOUNT, *agent_args(stub.url)).rc == 0
    (req,) = stub.received
    assert req.body == {"devices": ["0"], "force": False}


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (["--with-netdev"], "add withRdma or rdma"),
        (["--netdev", "a/b"], "netdev.name"),
        (["--netdev", "x", "--netdev-address", "10.0.0.2"], "addresses"),
    ],
    ids=["netdev-without-nic", "bad-interface", "address-without-prefix"],
)
def test_bad_flags_are_refused_before_any_request(
    nvcli: Nvcli, stub: StubAgent, flags: list[str], says: str
) -> None:
    run = nvcli(*MOUNT, *flags, *agent_args(stub.url))
    assert run.rc != 0 and says in run.err, run.err
    assert stub.received == []


def test_not_with_local(nvcli: Nvcli) -> None:
    run = nvcli("mount", "--local", "--container", "a" * 64, "--mount", "0", "--with-rdma")
    assert run.rc == 2 and "not --local" in run.err


@pytest.fixture
def veth() -> Iterator[str]:
    with veth_pair() as (end, _peer):
        yield end


@pytest.mark.kernel
def test_against_the_agent_mount_list_unmount(
    nvcli: Nvcli, real: RealCluster, tmp_path: Path, veth: str
) -> None:
    sys_root = build_sysfs(tmp_path / "sys-root", (replace(NICS[0], netdev=veth), NICS[1]))
    container = real.pod("nb")
    agent = real.agent(extra=["--sys-root", str(sys_root), "--netdev-allow", veth])
    args = agent_args(agent.url, ALICE, "default")

    listed = nvcli("list", *args)
    assert listed.rc == 0, listed.err
    header, *rows = listed.out.splitlines()
    assert "NEAREST" in header.split()
    nic = next(r.split() for r in rows if r.split()[2] == "rdma/mlx5_0")
    assert nic[3] == "rdma" and "0,1" in nic  # GPU 0 and 1 are nearest mlx5_0
    gpu0 = next(r.split() for r in rows if REAL_GPUS[0].uuid in r.split())
    assert "rdma/mlx5_0" in gpu0

    mounted = nvcli("mount", "--name", "nb", "--mount", "0", "--with-rdma", "--with-netdev", *args)
    assert mounted.rc == 0, mounted.err
    assert "rdma/mlx5_0" in mounted.out and f"network interfaces moved in: {veth}" in mounted.out
    shown = subprocess.run(
        ["nsenter", "-t", str(container.pid), "-n", "ip", "-j", "link", "show", "net1"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert shown.returncode == 0 and json.loads(shown.stdout)[0]["ifname"] == "net1"

    unmounted = nvcli("unmount", "--name", "nb", "--unmount", "0", *args)
    assert unmounted.rc == 0, unmounted.err
    assert "rdma/mlx5_0" in unmounted.out and f"given back: {veth}" in unmounted.out
    back = subprocess.run(["ip", "link", "show", veth], capture_output=True, check=False)
    assert back.returncode == 0
