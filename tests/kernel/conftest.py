"""Kernel tests: every test here runs on real runc containers (see tests/support/fixtures.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from hotmount.engine import Engine, EngineConfig
from tests.support.fixtures import GPU0, GPU1, STAND_IN_SPEC

__all__ = ["GPU0", "GPU1", "STAND_IN_SPEC"]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/kernel" in str(item.fspath):
            item.add_marker(pytest.mark.kernel)


@pytest.fixture
def engine(cdi_dir: Path, state_dir: Path) -> Engine:
    return Engine(
        EngineConfig(cdi_dirs=(str(cdi_dir),), state_dir=state_dir, use_nvml=False, stop_grace=2)
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
