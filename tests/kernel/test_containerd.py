"""The engine on a container made by containerd, with a kubelet's cgroupfs-driver path.

The container sits at `/kubepods/besteffort/pod<uid>/<id>` in every hierarchy,
exactly as a kubelet with the cgroupfs driver asks containerd for it (see
tests/support/containerd.py), and the engine is handed the CRI reference the
kubelet reports in the pod's status: `containerd://<id>`.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from hotmount.engine.core import Engine
from hotmount.host.containers import ContainerResolver, container_id_from_path, find_cgroup_dir
from tests.kernel.conftest import GPU0
from tests.support.containerd import (
    CGROUP_ROOT,
    Containerd,
    ContainerdContainer,
    missing_requirements,
    remove_cgroup_dirs,
)
from tests.support.runc import new_id

pytestmark = pytest.mark.kernel
WHY_NOT = missing_requirements()
OTHER_PODS = 300


@pytest.fixture(scope="module")
def containerd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Containerd]:
    if WHY_NOT is not None:
        if os.environ.get("CI"):
            pytest.fail(f"CI is set but the containerd tests cannot run: {WHY_NOT}")
        pytest.skip(f"containerd test: {WHY_NOT}")
    daemon = Containerd(tmp_path_factory.mktemp("ctrd"))
    try:
        yield daemon
    finally:
        daemon.stop()


@pytest.fixture
def pod_container(containerd: Containerd, rootfs: Path) -> Iterator[ContainerdContainer]:
    started = ContainerdContainer(containerd, rootfs)
    try:
        yield started
    finally:
        started.stop()


@pytest.fixture
def other_pods() -> Iterator[list[Path]]:
    """Empty cgroups of other pods' containers, in all three QoS classes, under devices."""
    devices = CGROUP_ROOT / "devices"
    made: list[str] = []
    try:
        for n in range(OTHER_PODS):
            qos = ("kubepods", "kubepods/besteffort", "kubepods/burstable")[n % 3]
            made.append(f"/{qos}/pod{uuid.uuid4()}/{new_id()}")
            (devices / made[-1].lstrip("/")).mkdir(parents=True)
        yield [devices / path.lstrip("/") for path in made]
    finally:
        for path in made:
            remove_cgroup_dirs(path)


def test_mount_by_cri_reference_into_a_kubepods_cgroup(
    engine: Engine, pod_container: ContainerdContainer
) -> None:
    reference = f"containerd://{pod_container.id}"
    kubelet_path = f"/kubepods/besteffort/pod{pod_container.pod_uid}/{pod_container.id}"
    # A node of the GPU's number made in the container: the cgroup denies it.
    pod_container.mknod("/tmp/gpu0", "c", 195, 0)
    assert pod_container.open_result("/tmp/gpu0") == "EPERM"
    assert pod_container.open_result("/dev/nvidia0") == "ENOENT"

    resolved = engine.resolve(reference)

    assert resolved.id == pod_container.id
    assert resolved.cgroups.v1_devices == kubelet_path
    assert resolved.cgroups.v2 == kubelet_path
    assert resolved.v1_devices_dir == pod_container.v1_devices_dir
    assert resolved.init_pid == pod_container.pid

    result = engine.mount(reference, [GPU0])

    assert [d.key for d in result.mounted] == [GPU0]
    # ENXIO: the pod's devices cgroup now lets the open through and no driver answers.
    assert pod_container.open_result("/dev/nvidia0") == "ENXIO"
    assert pod_container.open_result("/tmp/gpu0") == "ENXIO"
    assert pod_container.open_result("/dev/nvidiactl") == "ENXIO"
    assert pod_container.open_result("/dev/null") == "OK"
    rules = (pod_container.v1_devices_dir / "devices.list").read_text().splitlines()
    assert "c 195:0 rw" in rules

    engine.unmount(reference, [GPU0])

    assert "nvidia0" not in pod_container.ls_dev()
    assert "nvidiactl" not in pod_container.ls_dev()
    assert pod_container.open_result("/tmp/gpu0") == "EPERM"
    assert pod_container.open_result("/dev/null") == "OK"
    assert engine.ledger.records() == []


def test_pid_reference_resolves_to_the_same_container(
    engine: Engine, pod_container: ContainerdContainer
) -> None:
    by_pid = engine.resolve(f"pid:{pod_container.pid}")
    by_id = engine.resolve(f"containerd://{pod_container.id}")

    assert by_pid.cgroups.v1_devices == pod_container.cgroup_path
    assert container_id_from_path(pod_container.cgroup_path) == pod_container.id
    assert by_pid.id == by_id.id == pod_container.id
    assert by_pid.cgroups == by_id.cgroups
    assert by_pid.procs_dir == by_id.procs_dir
    assert by_pid.init_pid == by_id.init_pid == pod_container.pid


def test_walk_finds_the_container_among_other_pods(
    engine: Engine,
    pod_container: ContainerdContainer,
    other_pods: list[Path],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert len(other_pods) == OTHER_PODS and all(p.is_dir() for p in other_pods)

    def no_proc_scan(self: ContainerResolver, container_id: str) -> int | None:
        raise AssertionError(f"the cgroup walk missed {container_id}: fell back to /proc")

    # The /proc scan would find it too: the walk alone must.
    monkeypatch.setattr(ContainerResolver, "_scan_proc", no_proc_scan)
    devices = CGROUP_ROOT / "devices"
    assert find_cgroup_dir(devices, pod_container.id) == pod_container.v1_devices_dir
    assert find_cgroup_dir(devices, other_pods[-1].name) == other_pods[-1]

    resolved = engine.resolve(f"containerd://{pod_container.id}")

    assert resolved.id == pod_container.id
    assert resolved.init_pid == pod_container.pid
    assert resolved.cgroups.v1_devices == pod_container.cgroup_path
    assert resolved.v1_devices_dir == pod_container.v1_devices_dir


def test_proc_scan_finds_the_container_where_the_walk_does_not(
    engine: Engine, pod_container: ContainerdContainer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A layout deeper than the walk's bound: only the fallback over /proc can find it.
    monkeypatch.setattr("hotmount.host.containers.find_cgroup_dir", lambda root, container_id: None)

    resolved = engine.resolve(f"containerd://{pod_container.id}")

    assert resolved.id == pod_container.id
    assert resolved.init_pid == pod_container.pid
    assert resolved.cgroups.v1_devices == pod_container.cgroup_path
