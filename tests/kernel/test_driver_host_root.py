"""The driver's files are found in the host's `/` as the agent mounts it (the chart's
`/host`, `--driver-host-root`), not in the agent's own container: a driver root and a
CDI spec's hostPaths are resolved inside that view with openat2(RESOLVE_IN_ROOT), so
a symlink there (`/run/nvidia/driver -> /drivers/<v>`) means what it means on the
host and never reaches a file of the agent's own root.

Here `host_view` stands for the mounted host: a directory holding the stand-in driver
under `drivers/<version>` and `run/nvidia/driver` a symlink to it, paths that do not
exist in the test's (the agent's) own root.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from hotmount.driver import sources
from hotmount.driver.files import BIND, DriverFile
from hotmount.driver.place import HostSources
from hotmount.engine.core import Engine, EngineConfig
from hotmount.errors import DriverRefused, DriverUnavailable
from hotmount.hostfs import HostRoot
from tests.fakes import driver as stand_in
from tests.fakes import nvml
from tests.support.runc import RuncContainer, make_rootfs

pytestmark = pytest.mark.skipif(nvml.gcc() is None, reason="gcc builds the stand-in driver")

UUID = "GPU-5ca1ab1e-0000-4000-8000-000000000002"
LIB = stand_in.LIB_DIR
VERSION = stand_in.VERSION
HOST_DRIVER = f"/drivers/{VERSION}"  # where the driver is in the host view only
SMI = "FAKE_NVML_CONFIG=/etc/fake-gpus.conf exec nvidia-smi"


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return stand_in.build_root(tmp_path_factory.mktemp("driver"))


@pytest.fixture
def host_view(tmp_path: Path, built: Path) -> Path:
    view = tmp_path / "host"
    shutil.copytree(built, view / HOST_DRIVER.lstrip("/"), symlinks=True)
    (view / "run/nvidia").mkdir(parents=True)
    (view / "run/nvidia/driver").symlink_to(HOST_DRIVER)  # absolute: the host's own path
    assert not Path(HOST_DRIVER).exists() and not Path("/run/nvidia/driver").exists()
    return view


def _spec(lib_dir: str) -> str:
    mounts = "".join(
        f"    - {{hostPath: {lib_dir}{path}, containerPath: {path}, options: [ro, bind]}}\n"
        for path in (f"{LIB}/libnvidia-ml.so.{VERSION}", f"{LIB}/libcuda.so.{VERSION}",
                     "/usr/bin/nvidia-smi")
    )  # fmt: skip
    return (
        'cdiVersion: 0.6.0\nkind: nvidia.com/gpu\ndevices:\n  - name: "0"\n'
        "    containerEdits:\n      deviceNodes:\n"
        "        - {path: /dev/nvidia0, type: c, major: 195, minor: 0}\n"
        f"containerEdits:\n  mounts:\n{mounts}"
    )


def test_a_symlinked_driver_root_is_followed_inside_the_host_view(host_view: Path) -> None:
    found = sources.driver_set(
        HostRoot(Path("/")), (), "/run/nvidia/driver", [], HostRoot(host_view)
    )

    paths = {f.path for f in found.binds}
    assert {f"{LIB}/libnvidia-ml.so.{VERSION}", "/usr/bin/nvidia-smi"} <= paths
    assert f"/lib/firmware/nvidia/{VERSION}" in paths


def test_a_host_symlink_cannot_point_the_agent_at_its_own_files(
    host_view: Path, built: Path
) -> None:
    """Attack: the driver root in the host view links to a path that exists only in the
    agent's own root (the stand-in built outside the view). Resolved plainly, the agent
    would list and mount its own files; inside the view the path does not exist."""
    (host_view / "run/nvidia/driver").unlink()
    (host_view / "run/nvidia/driver").symlink_to(f"../../../../../../../..{built}")
    host = HostRoot(host_view)

    with pytest.raises(DriverUnavailable):
        sources.driver_set(HostRoot(Path("/")), (), "/run/nvidia/driver", [], host)
    # A file that names the agent's root through the same link is refused as well.
    opener = HostSources(host)
    try:
        with pytest.raises(DriverRefused):
            opener.open(DriverFile("/usr/bin/nvidia-smi", BIND, "/usr/bin/nvidia-smi",
                                   "/run/nvidia/driver"))  # fmt: skip
    finally:
        opener.close()


@pytest.fixture
def run_container(tmp_path: Path, mode: str) -> Iterator:
    made: list[RuncContainer] = []

    def start(rootfs: Path) -> RuncContainer:
        made.append(RuncContainer(tmp_path, rootfs, mode))
        return made[-1]

    yield start
    for container in made:
        container.stop()


@pytest.mark.parametrize("given", ["cdi-host-paths", "driver-root"])
def test_a_container_gets_the_driver_from_the_host_view(
    tmp_path: Path, host_view: Path, run_container, given: str
) -> None:
    """The chart's case: CDI hostPaths and a driver root that exist on the host only."""
    cdi = tmp_path / "cdi"
    cdi.mkdir()
    if given == "cdi-host-paths":
        (cdi / "nvidia.yaml").write_text(_spec("/run/nvidia/driver"))
        root = None
    else:
        (cdi / "nvidia.yaml").write_text(_spec("/run/nvidia/driver").split("  mounts:")[0])
        root = "/run/nvidia/driver"
    engine = Engine(
        EngineConfig(
            cdi_dirs=(str(cdi),), state_dir=tmp_path / "state", use_nvml=False,
            driver_root=root, driver_host_root=host_view,
        )
    )  # fmt: skip
    rootfs = make_rootfs(tmp_path / "image")
    stand_in.add_glibc(rootfs)
    (rootfs / "etc").mkdir()
    nvml.write_config(rootfs / "etc/fake-gpus.conf", [nvml.FakeGpu(UUID, "0000:3b:00.0", 0)])
    container = run_container(rootfs)

    engine.mount(container.id, ["nvidia.com/gpu=0"], with_driver=True)

    smi = container.exec("sh", "-c", SMI)
    assert smi.returncode == 0, smi.stdout + smi.stderr
    assert f"GPU 0: stand-in (UUID: {UUID})" in smi.stdout

    engine.unmount(container.id, ["nvidia.com/gpu=0"])

    assert container.exec("sh", "-c", SMI).returncode != 0
    assert engine.ledger.records() == []
