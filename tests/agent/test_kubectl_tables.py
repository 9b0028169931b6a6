"""What `kubectl get` prints for gpumounts and nodedevices: a real kubectl, parsing the
agent's Tables through the (fake) API server's discovery and front proxy."""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.agent.conftest import ALICE, DANA, AggregatedAgent, Cluster
from tests.agent.test_aggregated import GPUMOUNTS, gpumount, grant_cluster_resources
from tests.support.agent import GPUS

pytestmark = [
    pytest.mark.kernel,
    pytest.mark.skipif(shutil.which("kubectl") is None, reason="needs kubectl (setup.sh)"),
]
GPU0, GPU1 = GPUS


def kubectl(cluster: Cluster, token: str, *args: str) -> subprocess.CompletedProcess[str]:
    kubeconfig = cluster.kube.write_kubeconfig(cluster.workdir / f"{token}.kubeconfig", token)
    return subprocess.run(
        ["kubectl", "--kubeconfig", str(kubeconfig), "--cache-dir", str(cluster.workdir / "kc"),
         *args],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def printed(cluster: Cluster, token: str, *args: str) -> list[dict[str, str]]:
    """kubectl's table as rows of {HEADER: cell} (columns are two or more spaces apart)."""
    result = kubectl(cluster, token, "get", *args)
    assert result.returncode == 0, result.stderr
    if not result.stdout:  # "No resources found", on stderr
        return []
    header, *lines = result.stdout.splitlines()
    names = re.split(r"\s{2,}", header.strip())
    return [dict(zip(names, re.split(r"\s{2,}", line.strip()), strict=True)) for line in lines]


@pytest.fixture
def cluster(tmp_path: Path, rootfs: Path, cdi_dir: Path) -> Iterator[Cluster]:
    """The fake cluster, its API server on HTTPS: kubectl sends no token over plain HTTP."""
    made = Cluster(tmp_path, rootfs, cdi_dir, tls=True)
    try:
        yield made
    finally:
        made.close()


@pytest.fixture
def backend(cluster: Cluster) -> AggregatedAgent:
    grant_cluster_resources(cluster)
    return cluster.aggregated_agent()


def test_kubectl_get_gpumounts_prints_the_mounts_columns(
    cluster: Cluster, backend: AggregatedAgent
) -> None:
    cluster.pod("nb")
    with cluster.api(ALICE) as api:
        made = api.post(GPUMOUNTS, json=gpumount("nb", devices=["0"], idleTimeout="30m"))
        assert made.status_code == 201, made.text

    (row,) = printed(cluster, ALICE, "gpumounts")
    assert list(row) == ["NAME", "CONTAINER", "GPUS", "IDLE", "SHARED", "PIN OR HOLDER", "AGE"]
    assert row["NAME"] == "nb"
    assert row["GPUS"] == "0 (aaaaaaaa)"
    assert row["IDLE"].endswith("/30m")
    assert row["SHARED"] == "-"
    assert row["PIN OR HOLDER"].startswith("pin hotmount-pin-nb-")  # in the kubelet's books
    assert re.fullmatch(r"\d+s", row["AGE"]), row  # a creationTimestamp, not <unknown>

    (wide,) = printed(cluster, ALICE, "gpumounts", "-o", "wide")
    assert wide["NODE"] == "node-a" and wide["UUIDS"] == GPU0.uuid
    assert wide["PATHS"] == f"/dev/nvidia{GPU0.minor}"

    (one,) = printed(cluster, ALICE, "gpumount", "nb")
    assert one["GPUS"] == "0 (aaaaaaaa)"

    # -A: every namespace, with kubectl's own NAMESPACE column from the rows' metadata
    (everywhere,) = printed(cluster, ALICE, "gpumounts", "-A")
    assert (everywhere["NAMESPACE"], everywhere["NAME"]) == ("default", "nb")

    names = kubectl(cluster, ALICE, "get", "gpumounts", "-o", "name")
    assert names.stdout.split() == ["gpumount.hotmount.io/nb"], names.stderr


def test_kubectl_get_gpumounts_everywhere_is_the_api_servers_to_allow(
    cluster: Cluster, backend: AggregatedAgent
) -> None:
    """dana's RoleBinding covers `default` only: the API server refuses her `-A` before
    the agent is asked, as it does for pods."""
    refused = kubectl(cluster, DANA, "get", "gpumounts", "-A")
    assert refused.returncode != 0
    assert "cannot list resource" in refused.stderr and "cluster scope" in refused.stderr
    assert printed(cluster, DANA, "gpumounts", "-n", "default") == []


def test_kubectl_get_nodedevices_prints_each_device_and_its_holders(
    cluster: Cluster, backend: AggregatedAgent
) -> None:
    cluster.pod("nb")
    with cluster.api(ALICE) as api:
        assert api.post(GPUMOUNTS, json=gpumount("nb", devices=["1"])).status_code == 201

    rows = {r["GPU"]: r for r in printed(cluster, ALICE, "nodedevices")}
    assert set(rows) >= {"0", "1"}
    first = rows["1"]
    assert list(first) == ["NODE", "GPU", "UUID", "HELD BY", "MANAGED", "AGE"]
    assert (first["NODE"], first["UUID"]) == ("node-a", GPU1.uuid)
    assert first["HELD BY"].startswith("default/nb (main) [hotmount, pin hotmount-pin-nb-")
    assert rows["0"]["HELD BY"] == "<free>"
    assert first["MANAGED"] == "device plugin"  # the fake kubelet lists both as allocatable
    assert re.fullmatch(r"\d+[smhd].*", first["AGE"]), first

    wide = {r["GPU"]: r for r in printed(cluster, ALICE, "nodedevices", "node-a", "-o", "wide")}
    assert wide["1"]["DEVICE"] == GPU1.uuid and wide["1"]["PCI"].lower() == GPU1.bus_id.lower()
