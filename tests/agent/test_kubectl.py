"""kubectl as operators use it, against the agent through the (fake) API server's
discovery and front proxy: what `kubectl get` prints for gpumounts and nodedevices (the
agent's Tables), and `kubectl apply` / `delete` of a GPUMount (desired state)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.agent.conftest import ALICE, DANA, AggregatedAgent, Cluster
from tests.agent.test_aggregated import GPUMOUNTS, gpumount, grant_cluster_resources
from tests.fakes.kube_apiserver import AccessRule
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
    assert list(row) == [
        "NAME", "CONTAINER", "GPUS", "IDLE", "SHARED", "PIN OR HOLDER", "QUEUE", "AGE"
    ]  # fmt: skip
    assert row["QUEUE"] == "-"  # not waiting for an on-demand GPU
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


# -- kubectl apply: a GPUMount's spec is what the pod should have -----------------------------


def gpumount_file(cluster: Cluster, **spec: object) -> str:
    path = cluster.workdir / "gpumount.yaml"
    document = {"apiVersion": "hotmount.io/v1alpha1", "kind": "GPUMount",
                "metadata": {"name": "nb"}, "spec": spec}  # fmt: skip
    path.write_text(yaml.safe_dump(document))
    return str(path)


def applied(cluster: Cluster, *args: str) -> str:
    """`kubectl apply`, its client-side validation off: the fake API server publishes no
    OpenAPI v2 (a protobuf document) to validate against. tests/k8s applies with it on."""
    result = kubectl(cluster, ALICE, "apply", "--validate=false", *args)
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_kubectl_apply_mounts_the_difference_and_delete_unmounts_all(
    cluster: Cluster, backend: AggregatedAgent
) -> None:
    nb = cluster.pod("nb")
    gpu0, gpu1 = (f"/dev/nvidia{g.minor}" for g in GPUS)

    assert "gpumount.hotmount.io/nb" in applied(
        cluster, "-f", gpumount_file(cluster, devices=["0"])
    )
    assert (nb.open_result(gpu0), nb.open_result(gpu1)) == ("ENXIO", "ENOENT")
    assert "unchanged" in applied(cluster, "-f", gpumount_file(cluster, devices=["0"]))

    edited = applied(cluster, "-f", gpumount_file(cluster, devices=["1"]))
    assert "configured" in edited
    assert (nb.open_result(gpu0), nb.open_result(gpu1)) == ("ENOENT", "ENXIO")
    got = json.loads(kubectl(cluster, ALICE, "get", "gpumount", "nb", "-o", "json").stdout)
    assert got["spec"] == {"devices": ["1"]}
    assert "kubectl.kubernetes.io/last-applied-configuration" in got["metadata"]["annotations"]

    deleted = kubectl(cluster, ALICE, "delete", "gpumount", "nb")
    assert deleted.returncode == 0, deleted.stderr
    assert (nb.open_result(gpu0), nb.open_result(gpu1)) == ("ENOENT", "ENOENT")
    got = json.loads(kubectl(cluster, ALICE, "get", "gpumount", "nb", "-o", "json").stdout)
    assert "spec" not in got and "annotations" not in got["metadata"]


def test_kubectl_apply_by_count_keeps_that_many(cluster: Cluster, backend: AggregatedAgent) -> None:
    nb = cluster.pod("nb")
    applied(cluster, "-f", gpumount_file(cluster, count=2))
    assert [nb.open_result(f"/dev/nvidia{g.minor}") for g in GPUS] == ["ENXIO", "ENXIO"]
    assert "unchanged" in applied(cluster, "-f", gpumount_file(cluster, count=2))
    applied(cluster, "-f", gpumount_file(cluster, count=1))
    assert sorted(nb.open_result(f"/dev/nvidia{g.minor}") for g in GPUS) == ["ENOENT", "ENXIO"]


def test_server_side_apply_and_dry_run_are_refused_and_change_nothing(
    cluster: Cluster, backend: AggregatedAgent
) -> None:
    nb = cluster.pod("nb")
    path = gpumount_file(cluster, devices=["0"])
    server_side = kubectl(cluster, ALICE, "apply", "--validate=false", "--server-side", "-f", path)
    assert server_side.returncode != 0
    assert "server-side apply is not supported for gpumounts" in server_side.stderr
    dry = kubectl(cluster, ALICE, "apply", "--validate=false", "--dry-run=server", "-f", path)
    assert dry.returncode != 0 and "dry run is not supported" in dry.stderr, dry.stderr
    assert nb.open_result(f"/dev/nvidia{GPUS[0].minor}") == "ENOENT"

    applied(cluster, "-f", path)
    kept = kubectl(cluster, ALICE, "delete", "gpumount", "nb", "--dry-run=server")
    assert kept.returncode != 0 and "dry run is not supported" in kept.stderr, kept.stderr
    assert nb.open_result(f"/dev/nvidia{GPUS[0].minor}") == "ENXIO"

    invalid = kubectl(
        cluster,
        ALICE,
        "apply",
        "--validate=false",
        "-f",
        gpumount_file(cluster, devices=["0"], count=1),
    )
    assert invalid.returncode != 0 and "either devices or count" in invalid.stderr
    assert nb.open_result(f"/dev/nvidia{GPUS[0].minor}") == "ENXIO"  # as it was


def test_patch_alone_does_not_let_a_caller_mount_or_unmount(
    cluster: Cluster, backend: AggregatedAgent
) -> None:
    """The API server lets `get` and `patch gpumounts` through; the agent still asks for
    `create` (and `delete`) on the pod, as for a mount, so a role that grants those alone
    mounts nothing, and takes nothing away."""
    nb = cluster.pod("nb")
    cluster.kube.add_token("pat-token", "pat", [])
    for verb in ("get", "patch"):  # what kubectl apply needs, and nothing more
        cluster.kube.allow(
            AccessRule(user="pat", api_group="hotmount.io", resource="gpumounts", verb=verb)
        )
    refused = kubectl(
        cluster, "pat-token", "apply", "--validate=false", "-f",
        gpumount_file(cluster, devices=["0"]),
    )  # fmt: skip
    assert refused.returncode != 0, refused.stdout
    assert "cannot create gpumounts.hotmount.io" in refused.stderr, refused.stderr
    assert nb.open_result(f"/dev/nvidia{GPUS[0].minor}") == "ENOENT"

    applied(cluster, "-f", gpumount_file(cluster, devices=["0"]))  # alice's
    taken = kubectl(
        cluster, "pat-token", "apply", "--validate=false", "-f",
        gpumount_file(cluster, devices=["1"]),
    )  # fmt: skip
    assert taken.returncode != 0
    assert nb.open_result(f"/dev/nvidia{GPUS[0].minor}") == "ENXIO"
    assert nb.open_result(f"/dev/nvidia{GPUS[1].minor}") == "ENOENT"
