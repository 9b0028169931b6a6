"""Shared fixtures for tests on real containers (a pytest plugin, see tests/conftest.py).

Stand-in devices (no GPU here): `nvidia.com/gpu=0` is 195:0, which no driver
answers, so `open()` gives EPERM while the cgroup denies it and ENXIO once it
is granted. `nvidia.com/gpu=1` is /dev/fuse's 10:229, a real driver: it opens
after the grant and can be held open by a container process.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.runc import RuncContainer, make_rootfs, missing_requirements

WHY_NOT = missing_requirements()

STAND_IN_SPEC = """\
cdiVersion: 0.6.0
kind: nvidia.com/gpu
devices:
  - name: "0"
    containerEdits:
      deviceNodes:
        - {path: /dev/nvidia0, type: c, major: 195, minor: 0}
  - name: "1"
    containerEdits:
      deviceNodes:
        - {path: /dev/nvidia1, type: c, major: 10, minor: 229}
  - name: disk
    containerEdits:
      deviceNodes:
        - {path: /dev/nvidia-disk, type: b, major: 7, minor: 0}
containerEdits:
  deviceNodes:
    - {path: /dev/nvidiactl, type: c, major: 195, minor: 255}
"""
GPU0, GPU1 = "nvidia.com/gpu=0", "nvidia.com/gpu=1"


@pytest.fixture(scope="session")
def rootfs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_rootfs(tmp_path_factory.mktemp("rootfs"))


@pytest.fixture(scope="session")
def cdi_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("cdi")
    (directory / "stand-in.yaml").write_text(STAND_IN_SPEC)
    return directory


@pytest.fixture
def state_dir(tmp_path: Path) -> Path:
    return tmp_path / "state"


@pytest.fixture(params=["v1", "v2"])
def mode(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
def container(tmp_path: Path, rootfs: Path, mode: str) -> Iterator[RuncContainer]:
    started = RuncContainer(tmp_path, rootfs, mode)
    try:
        yield started
    finally:
        started.stop()


@pytest.fixture
def make_container(tmp_path: Path, rootfs: Path) -> Iterator:
    made: list[RuncContainer] = []

    def make(mode: str) -> RuncContainer:
        made.append(RuncContainer(tmp_path, rootfs, mode))
        return made[-1]

    yield make
    for c in made:
        c.stop()
