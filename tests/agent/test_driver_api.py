"""The driver's files over HTTP (issue 19): a real agent, a real runc container from a
plain image (busybox and a glibc, no NVIDIA file), the stand-in driver of
tests/fakes/driver as the node's --driver-root. `withDriver` and the node's
--inject-driver decide; the result says what was added and what to export."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.agent.conftest import ALICE, Cluster
from tests.fakes import driver as stand_in
from tests.fakes import nvml
from tests.support.agent import GPUS, pod_manifest
from tests.support.runc import RuncContainer, make_rootfs

pytestmark = [
    pytest.mark.kernel,
    pytest.mark.skipif(nvml.gcc() is None, reason="gcc builds the stand-in driver"),
]
PODS = "/v1/namespaces/default/pods/nb/devices"
LIB = stand_in.LIB_DIR
SMI = "FAKE_NVML_CONFIG=/etc/fake-gpus.conf exec nvidia-smi"
UUID = "GPU-5ca1ab1e-0000-4000-8000-000000000001"


@pytest.fixture(scope="module")
def driver_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return stand_in.build_root(tmp_path_factory.mktemp("driver"))


def plain_rootfs(directory: Path) -> Path:
    """A plain image's root: busybox and a glibc, no NVIDIA file."""
    rootfs = make_rootfs(directory)
    stand_in.add_glibc(rootfs)
    (rootfs / "etc").mkdir()
    nvml.write_config(rootfs / "etc/fake-gpus.conf", [nvml.FakeGpu(UUID, "0000:3b:00.0", 0)])
    return rootfs


def plain_pod(cluster: Cluster, name: str = "nb") -> RuncContainer:
    """A pod whose image has a glibc and no NVIDIA file, started without any runtime help."""
    rootfs = plain_rootfs(cluster.workdir / f"image-{name}")
    container = RuncContainer(cluster.workdir, rootfs, "v2")
    cluster.containers.append(container)
    cluster.kube.put_pod(pod_manifest(name, container))
    return container


def smi(container: RuncContainer) -> tuple[int, str]:
    result = container.exec("sh", "-c", SMI)
    return result.returncode, result.stdout + result.stderr


@pytest.mark.parametrize(
    ("body", "flags"),
    [({"withDriver": True}, ["--inject-driver", "always"]), ({}, [])],
    ids=["with-driver", "node-default-auto"],
)
def test_the_stand_in_nvidia_smi_runs_after_the_mount_and_is_gone_after_the_unmount(
    cluster: Cluster, driver_root: Path, body: dict[str, object], flags: list[str]
) -> None:
    container = plain_pod(cluster)
    agent = cluster.agent(extra=["--driver-root", str(driver_root), *flags])
    assert smi(container)[0] != 0  # nvidia-smi: not found
    with agent.client(ALICE) as api:
        mounted = api.post(PODS, json={"devices": ["0"], **body})

        assert mounted.status_code == 200, mounted.text
        code, out = smi(container)
        assert code == 0, out
        assert f"GPU 0: stand-in (UUID: {UUID})" in out
        driver = mounted.json()["driver"]
        assert driver["origin"] == f"driver root {driver_root} (version {stand_in.VERSION})"
        assert f"{LIB}/libnvidia-ml.so.{stand_in.VERSION}" in driver["files"]
        assert "/usr/bin/nvidia-smi" in driver["files"]
        assert driver["env"] == {}  # the soname links need no LD_LIBRARY_PATH here
        assert driver["ignoredHooks"] == []

        unmounted = api.delete(f"{PODS}/0")

        assert unmounted.status_code == 200, unmounted.text
        assert unmounted.json()["unmounted"] == [GPUS[0].uuid]
        assert "/usr/bin/nvidia-smi" in unmounted.json()["driverRemoved"]
        assert smi(container)[0] != 0
        assert container.exec("ls", LIB).stdout.split() == []


def test_a_container_that_has_libcuda_gets_no_driver_files_under_auto(
    cluster: Cluster, driver_root: Path
) -> None:
    """auto: the container's linker already finds a libcuda.so.1 (the NVIDIA runtime
    gave it one): the device alone, as before."""
    container = plain_pod(cluster)
    own = container.exec("sh", "-c", f"mkdir -p {LIB} && echo own > {LIB}/libcuda.so.1")
    assert own.returncode == 0, own.stderr
    agent = cluster.agent(extra=["--driver-root", str(driver_root)])
    with agent.client(ALICE) as api:
        mounted = api.post(PODS, json={"devices": ["0"]})

        assert mounted.status_code == 200, mounted.text
        assert mounted.json()["driver"] is None
        assert smi(container)[0] != 0
        assert f"nvidia{GPUS[0].minor}" in container.ls_dev()


@pytest.mark.parametrize(
    ("body", "code", "words"),
    [
        ({"devices": ["0"], "withDriver": True}, 400, "--driver-root"),
        ({"devices": ["0"], "withDriver": "please"}, 422, "withDriver"),
    ],
    ids=["no-driver-source", "not-a-bool"],
)
def test_bad_driver_requests_change_nothing(
    cluster: Cluster, body: dict[str, object], code: int, words: str
) -> None:
    """No --driver-root and a CDI spec with no mounts: withDriver is a clear 400, and
    neither the device nor any file goes in."""
    container = plain_pod(cluster)
    agent = cluster.agent()
    with agent.client(ALICE) as api:
        refused = api.post(PODS, json=body)

        assert refused.status_code == code, refused.text
        assert refused.json()["kind"] == "Status" and words in refused.json()["message"]
        if code == 400:
            assert refused.json()["reason"] == "DriverUnavailable"
        assert f"nvidia{GPUS[0].minor}" not in container.ls_dev()
        assert api.get(PODS).json()["containers"] == []
        assert container.exec("ls", "/usr/bin/nvidia-smi").returncode != 0


def test_with_driver_on_a_node_whose_inject_driver_is_never_is_refused_and_changes_nothing(
    cluster: Cluster, driver_root: Path
) -> None:
    """`--inject-driver=never` is the node's off switch: a request cannot turn it on. The
    caller asked for something the node forbids: a clear 400, no device, no file."""
    container = plain_pod(cluster)
    agent = cluster.agent(extra=["--driver-root", str(driver_root), "--inject-driver", "never"])
    with agent.client(ALICE) as api:
        refused = api.post(PODS, json={"devices": ["0"], "withDriver": True})

        assert refused.status_code == 400, refused.text
        assert refused.json()["reason"] == "DriverUnavailable"
        assert "--inject-driver=never" in refused.json()["message"]
        assert f"nvidia{GPUS[0].minor}" not in container.ls_dev()
        assert api.get(PODS).json()["containers"] == []
        assert smi(container)[0] != 0

        plain = api.post(PODS, json={"devices": ["0"]})  # the GPU alone still comes

        assert plain.status_code == 200, plain.text
        assert plain.json()["driver"] is None
        assert smi(container)[0] != 0
