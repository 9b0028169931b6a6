"""nvcli against a real agent on a MIG node (tests/support/mig.py): `nvcli list` shows the
instance by its MIG UUID with its profile, and `nvcli mount`/`unmount` take that UUID."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.agent.conftest import ALICE, Cluster
from tests.cli.conftest import Run
from tests.fakes import nvml as fake_nvml
from tests.support.agent import AgentProcess
from tests.support.mig import CAP_PATHS, MIG_ALIAS, MIG_KEY, MIG_UUID, PROFILE, mig_node

pytestmark = [
    pytest.mark.kernel,
    pytest.mark.skipif(fake_nvml.gcc() is None, reason="gcc builds the fake libnvidia-ml.so.1"),
]
Nvcli = Callable[..., Run]


def flags(agent: AgentProcess) -> list[str]:
    return ["--agent", agent.url, "--token", ALICE, "-n", "default"]


def row(listing: str, key: str) -> list[str]:
    return next(line.split() for line in listing.splitlines() if key in line.split())


def test_nvcli_lists_and_mounts_a_mig_instance_by_uuid(
    nvcli: Nvcli, real: Cluster, tmp_path: Path
) -> None:
    a = real.pod("nb-a")
    node = mig_node(tmp_path)
    agent = real.agent(extra=["--use-nvml"], **node.agent_kwargs(nvml=True))

    listing = nvcli("list", *flags(agent))
    assert listing.rc == 0, listing.err
    # DEVICE, KIND with its profile, UUID, ALIASES.
    assert row(listing.out, MIG_KEY)[2:7] == [
        MIG_KEY,
        "mig",
        PROFILE,
        MIG_UUID,
        f"{MIG_UUID},{MIG_ALIAS}",
    ]

    mounted = nvcli("mount", "--name", "nb-a", f"--mount={MIG_UUID}", *flags(agent), "-o", "json")
    assert mounted.rc == 0, mounted.err
    assert [(d["key"], d["uuid"]) for d in json.loads(mounted.out)["mounted"]] == [
        (MIG_KEY, MIG_UUID)
    ]
    assert a.open_result(CAP_PATHS[1]) == "ENXIO"

    unmounted = nvcli("unmount", "--name", "nb-a", "--unmount", MIG_UUID, *flags(agent))
    assert unmounted.rc == 0, unmounted.err
    assert a.open_result(CAP_PATHS[1]) == "ENOENT"


def test_nvcli_list_says_a_mig_instance_has_no_uuid_without_nvml(
    nvcli: Nvcli, real: Cluster, tmp_path: Path
) -> None:
    node = mig_node(tmp_path)
    agent = real.agent(**node.agent_kwargs(nvml=False))
    listing = nvcli("list", *flags(agent))
    assert listing.rc == 0, listing.err
    assert "<none: no NVML>" in " ".join(row(listing.out, MIG_KEY))
