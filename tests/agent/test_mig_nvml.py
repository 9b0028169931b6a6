"""MIG instances from NVML, over HTTP: listed by MIG UUID with profile and memory, mounted by
that UUID into a real runc container, and held as one physical device with its parent GPU.

The agent's GPU 0 (/dev/nvidia3) carries MIG instance GI 1 / CI 0 (tests/support/mig.py):
its capability nodes come from /proc, its UUID from the fake NVML.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.agent.conftest import ALICE, Cluster
from tests.fakes import nvml as fake_nvml
from tests.support.agent import AgentProcess
from tests.support.mig import (
    CAP_PATHS,
    CI,
    GI,
    MEMORY_MIB,
    MIG_ALIAS,
    MIG_KEY,
    MIG_UUID,
    PARENT,
    PROFILE,
    mig_node,
)

pytestmark = [
    pytest.mark.kernel,
    pytest.mark.skipif(fake_nvml.gcc() is None, reason="gcc builds the fake libnvidia-ml.so.1"),
]
PARENT_NODE = f"/dev/nvidia{PARENT.minor}"


def agent(cluster: Cluster, tmp_path: Path, *, nvml: bool) -> AgentProcess:
    node = mig_node(tmp_path)
    extra = ["--use-nvml"] if nvml else []
    return cluster.agent(extra=extra, **node.agent_kwargs(nvml=nvml))


def mount(api: Any, pod: str, *devices: str) -> Any:
    return api.post(f"/v1/namespaces/default/pods/{pod}/devices", json={"devices": list(devices)})


def listed(api: Any) -> dict[str, dict[str, Any]]:
    return {d["key"]: d for d in api.get("/v1/devices").json()["devices"]}


def test_a_mig_instance_is_listed_and_mounted_by_its_nvml_uuid(
    cluster: Cluster, tmp_path: Path
) -> None:
    a = cluster.pod("a")
    b = cluster.pod("b", mode="v2")
    with agent(cluster, tmp_path, nvml=True).client(ALICE) as api:
        mig = listed(api)[MIG_KEY]
        assert (mig["kind"], mig["uuid"], mig["parent"]) == ("mig", MIG_UUID, PARENT.uuid)
        assert mig["aliases"] == [MIG_UUID, MIG_ALIAS]
        assert mig["mig"] == {
            "gpuInstance": GI,
            "computeInstance": CI,
            "source": "nvml",
            "profile": PROFILE,
            "memoryMiB": MEMORY_MIB,
        }
        assert a.open_result(CAP_PATHS[1]) == "ENOENT"

        mounted = mount(api, "a", MIG_UUID)

        assert mounted.status_code == 200, mounted.text
        (device,) = mounted.json()["mounted"]
        assert (device["key"], device["uuid"]) == (MIG_KEY, MIG_UUID)
        # Granted, no driver behind: the parent's node and both capability nodes.
        for path in (PARENT_NODE, *CAP_PATHS):
            assert a.open_result(path) == "ENXIO", path

        # One physical device, one holder: the parent GPU, and the instance by its /proc
        # name, are the same hardware (409 naming a), and b gets nothing.
        before = b.ls_dev()
        for name in ("0", PARENT.uuid, MIG_ALIAS, MIG_UUID):
            refused = mount(api, "b", name)
            assert refused.status_code == 409, (name, refused.text)
            assert "default/a" in refused.json()["message"]
        assert b.ls_dev() == before

        # Unmounted by its UUID, the parent is free again.
        gone = api.delete(f"/v1/namespaces/default/pods/a/devices/{MIG_UUID}")
        assert gone.status_code == 200, gone.text
        assert not {p.rsplit("/", 1)[-1] for p in CAP_PATHS} & set(a.ls_dev())
        assert mount(api, "b", "0").status_code == 200
        assert b.open_result(PARENT_NODE) == "ENXIO"


def test_without_nvml_the_instance_comes_from_proc_and_has_no_uuid(
    cluster: Cluster, tmp_path: Path
) -> None:
    a = cluster.pod("a")
    with agent(cluster, tmp_path, nvml=False).client(ALICE) as api:
        mig = listed(api)[MIG_KEY]
        assert (mig["uuid"], mig["aliases"], mig["mig"]["source"]) == (None, [MIG_ALIAS], "procfs")
        assert mig["mig"]["profile"] is None

        unknown = mount(api, "a", MIG_UUID)
        assert unknown.status_code == 404, unknown.text
        assert a.open_result(CAP_PATHS[1]) == "ENOENT"

        assert mount(api, "a", MIG_ALIAS).status_code == 200
        assert a.open_result(CAP_PATHS[1]) == "ENXIO"
