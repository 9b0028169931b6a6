"""Kernel tests: every test here runs on real runc containers (see tests/support/fixtures.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from hotmount.engine.core import Engine, EngineConfig
from tests.support.fixtures import GPU0, GPU1, STAND_IN_SPEC

__all__ = ["GPU0", "GPU1", "STAND_IN_SPEC"]

# Stand-in devices whose nodes live in a subdirectory of /dev (as RDMA's /dev/infiniband,
# MIG's /dev/nvidia-caps, /dev/dri): that directory is the tenant's to replace.
NIC0, NIC1 = "example.com/nic=0", "example.com/nic=1"
SUBDIR_SPEC = """\
cdiVersion: 0.6.0
kind: example.com/nic
devices:
  - name: "0"
    containerEdits:
      deviceNodes:
        - {path: /dev/infiniband/uverbs0, type: c, major: 231, minor: 192}
  - name: "1"
    containerEdits:
      deviceNodes:
        - {path: /dev/infiniband/uverbs1, type: c, major: 231, minor: 193}
"""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/kernel" in str(item.fspath):
            item.add_marker(pytest.mark.kernel)


@pytest.fixture
def engine(cdi_dir: Path, state_dir: Path) -> Engine:
    return Engine(
        EngineConfig(cdi_dirs=(str(cdi_dir),), state_dir=state_dir, use_nvml=False, stop_grace=2)
    )


@pytest.fixture
def subdir_engine(cdi_dir: Path, state_dir: Path, tmp_path: Path) -> Engine:
    """The stand-in GPUs and NIC0/NIC1, whose nodes are in /dev/infiniband."""
    nics = tmp_path / "cdi-nics"
    nics.mkdir()
    (nics / "nics.yaml").write_text(SUBDIR_SPEC)
    return Engine(
        EngineConfig(
            cdi_dirs=(str(cdi_dir), str(nics)), state_dir=state_dir, use_nvml=False, stop_grace=2
        )
    )


def engine_cli(cdi_dir: Path, state_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The engine as a separate process, as an operator's script would run it."""
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "hotmount",
            *args,
            "--cdi-dir",
            str(cdi_dir),
            "--state-dir",
            str(state_dir),
            "--no-nvml",
            "-o",
            "json",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
