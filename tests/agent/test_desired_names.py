"""A GPUMount's applied spec is kept in a file named by a digest (agent/node/desired.py),
so a pod with the longest name Kubernetes allows (253 characters) is applied, read and
deleted like any other. Named `<namespace>_<pod>_<digest>.json`, its file passed
NAME_MAX: GET and PATCH answered 500, and `kubectl delete` unmounted, then answered 500.
"""

from __future__ import annotations

import os

import pytest

from tests.agent.conftest import ALICE, AggregatedAgent, Cluster
from tests.agent.test_aggregated import GPUMOUNTS, grant_cluster_resources
from tests.support.agent import GPUS

pytestmark = pytest.mark.kernel
LONGEST = ("nb-" + "x" * 250)[:253]  # a DNS subdomain's most: 253 characters
MERGE_PATCH = {"content-type": "application/merge-patch+json"}


@pytest.fixture
def backend(cluster: Cluster) -> AggregatedAgent:
    grant_cluster_resources(cluster)
    return cluster.aggregated_agent()


def test_a_pod_with_a_253_character_name_is_applied_read_and_deleted(
    cluster: Cluster, backend: AggregatedAgent
) -> None:
    assert len(LONGEST) == 253
    nb = cluster.pod(LONGEST)
    gpu0 = f"/dev/nvidia{GPUS[0].minor}"
    with cluster.api(ALICE) as api:
        patched = api.patch(
            f"{GPUMOUNTS}/{LONGEST}",
            json={"metadata": {"annotations": {"a": "b"}}, "spec": {"devices": ["0"]}},
            headers=MERGE_PATCH,
        )
        assert patched.status_code == 200, patched.text
        assert patched.json()["spec"] == {"devices": ["0"]}
        assert nb.open_result(gpu0) == "ENXIO"

        got = api.get(f"{GPUMOUNTS}/{LONGEST}")
        assert got.status_code == 200, got.text
        assert got.json()["spec"] == {"devices": ["0"]}
        assert got.json()["metadata"]["annotations"] == {"a": "b"}
        kept = os.listdir(cluster.workdir / "state-node-a" / "desired")
        assert len(kept) == 1 and len(kept[0]) == 64 + len(".json")

        deleted = api.delete(f"{GPUMOUNTS}/{LONGEST}")
        assert deleted.status_code == 200, deleted.text
        assert nb.open_result(gpu0) == "ENOENT"
        again = api.get(f"{GPUMOUNTS}/{LONGEST}")
        assert again.status_code == 200, again.text
        assert "spec" not in again.json()
    assert os.listdir(cluster.workdir / "state-node-a" / "desired") == []
