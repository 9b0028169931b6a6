"""nvcli as a namespaced tenant and as an operator: what works, and what each refusal says.

The real agent behind the fake API server (tests/agent/conftest.py): dana holds the
shipped `hotmount-user` through a RoleBinding in `default`, olga the shipped
`hotmount-admin` through a ClusterRoleBinding. A refusal must exit 5, name the exact
resource, verb, scope and role to ask for, and change nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from cli.client import HotmountClient
from tests.agent.conftest import DANA, OLGA, Cluster
from tests.cli.conftest import Cluster as StubCluster
from tests.cli.conftest import Run
from tests.fakes import AccessRule
from tests.support.agent import GPUS

Nvcli = Callable[..., Run]
NVIDIA3 = f"/dev/nvidia{GPUS[0].minor}"  # GPU 0
PREFIX = "/apis/hotmount.io/v1alpha1"


def test_move_within_a_namespace_is_namespaced(stub_cluster: StubCluster) -> None:
    config = stub_cluster.kubeconfig("alice", token="alice-token")
    with HotmountClient.from_kubeconfig(str(config)) as hm:
        hm.move("0", ("ml", "nb-0"), ("ml", "nb-1"))
        hm.move("0", ("ml", "nb-1"), ("ops", "nb-2"))
    within, across = stub_cluster.agent.received
    assert within.path == f"{PREFIX}/namespaces/ml/reassignments"
    assert within.body["metadata"] == {"namespace": "ml"}
    assert across.path == f"{PREFIX}/reassignments"


@pytest.fixture
def stub_cluster(cluster: StubCluster) -> StubCluster:
    cluster.apiserver.allow(AccessRule(group="ml-team", api_group="hotmount.io", namespace="ops"))
    return cluster


@pytest.mark.kernel
def test_a_namespaced_tenant_and_an_operator(nvcli: Nvcli, real: Cluster, tmp_path: Path) -> None:
    a, b = real.pod("a"), real.pod("b")
    real.pod("c", namespace="team-b")
    real.aggregated_agent()
    dana = ["--kubeconfig", str(real.kube.write_kubeconfig(tmp_path / "dana", token=DANA))]
    olga = ["--kubeconfig", str(real.kube.write_kubeconfig(tmp_path / "olga", token=OLGA))]

    assert nvcli("mount", "--name", "a", "--mount", "0", *dana).rc == 0
    moved = nvcli("move", "--gpu", "0", "--from", "a", "--to", "b", *dana)
    assert moved.rc == 0, moved.err
    assert a.open_result(NVIDIA3) == "ENOENT" and b.open_result(NVIDIA3) == "ENXIO"

    refusals = {
        "mount": nvcli("mount", "--name", "a", "--mount", "0", "--force", *dana),
        "unmount": nvcli("unmount", "--name", "b", "--unmount", "0", "--force", *dana),
        "move": nvcli("move", "--gpu", "0", "--from", "b", "--to", "a", "--force", *dana),
    }
    for command, run in refusals.items():
        assert run.rc == 5, (command, run.err)
        assert "cannot force gpumounts.hotmount.io" in run.err, run.err
        assert "ask for force on gpumounts.hotmount.io in namespace default" in run.err
        assert "ClusterRole hotmount-admin" in run.err
    assert a.open_result(NVIDIA3) == "ENOENT" and b.open_result(NVIDIA3) == "ENXIO"

    listing = nvcli("list", *dana)
    assert listing.rc == 5, listing.err
    assert "ask for list on nodedevices.hotmount.io at the cluster scope" in listing.err
    assert "ClusterRole hotmount-viewer" in listing.err and "gpumounts" not in listing.err

    across = nvcli("move", "--gpu", "0", "--from", "b", "--to", "c", "--to-namespace", "team-b",
                   *dana)  # fmt: skip
    assert across.rc == 5, across.err
    assert "between namespaces needs create on reassignments.hotmount.io at the cluster scope" in (
        across.err
    )
    assert b.open_result(NVIDIA3) == "ENXIO"

    forced = nvcli("move", "--gpu", "0", "--from", "b", "--to", "a", "--force", *olga)
    assert forced.rc == 0, forced.err
    assert a.open_result(NVIDIA3) == "ENXIO" and b.open_result(NVIDIA3) == "ENOENT"
    listed = nvcli("list", *olga)
    assert listed.rc == 0, listed.err
    assert "default/a (main) [hotmount, pin hotmount-pin-a-" in listed.out
