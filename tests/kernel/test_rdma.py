"""RDMA devices with the GPU on real runc containers: stand-in verbs nodes declared by a
fixture sysfs (tests/support/sysfs.py) beside the stand-in GPUs' CDI spec.

Stand-ins: mlx5_0's uverbs0 is 231:192 (no driver here: EPERM denied, ENXIO granted),
mlx5_1's uverbs1 is /dev/loop-control's 10:237 (a real driver: a process can hold it open),
rdma_cm is 10:58 (no misc driver: EPERM denied, ENODEV granted). GPU 0 (195:0) sits on
mlx5_0's PCIe switch; GPU 1 (10:229) on mlx5_1's NUMA node.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from hotmount.engine.core import Engine, EngineConfig
from hotmount.errors import DeviceBusy, DeviceClaimed, InvalidDeviceRef
from tests.kernel.conftest import GPU0, GPU1
from tests.support.runc import RuncContainer
from tests.support.sysfs import NICS, add_char_device, build_sysfs

UVERBS0, UVERBS1 = "/dev/infiniband/uverbs0", "/dev/infiniband/uverbs1"
RDMA_CM = "/dev/infiniband/rdma_cm"
STAND_IN_NICS = (NICS[0], replace(NICS[1], number=(10, 237)))


@pytest.fixture
def sys_root(tmp_path: Path) -> Path:
    root = build_sysfs(tmp_path / "sys-root", STAND_IN_NICS)
    add_char_device(root, 195, 0, "0000:18:00.0")  # GPU 0's node, on mlx5_0's switch
    add_char_device(root, 10, 229, "0000:86:00.0")  # GPU 1's, on mlx5_1's NUMA node
    return root


@pytest.fixture
def engine(cdi_dir: Path, state_dir: Path, sys_root: Path) -> Engine:
    return Engine(
        EngineConfig(
            cdi_dirs=(str(cdi_dir),),
            state_dir=state_dir,
            use_nvml=False,
            stop_grace=2,
            sys_root=sys_root,
        )
    )


def test_with_rdma_mounts_the_nearest_nic_and_unmounts_it_with_the_gpu(
    engine: Engine, container: RuncContainer
) -> None:
    assert container.open_result(UVERBS0) == "ENOENT"

    result = engine.mount(container.id, [GPU0], with_rdma=True)

    assert [d.key for d in result.mounted] == [GPU0, "rdma/mlx5_0"]
    assert container.open_result(UVERBS0) == "ENXIO"  # granted, no driver
    assert container.open_result(RDMA_CM) == "ENODEV"  # granted, no misc driver
    assert container.open_result(UVERBS1) == "ENOENT"  # not the far NIC
    assert container.open_result("/dev/nvidia0") == "ENXIO"

    done = engine.unmount(container.id, [GPU0])

    assert sorted(done.unmounted) == sorted([GPU0, "rdma/mlx5_0"])
    dev = container.exec("ls", "/dev/infiniband").stdout.split()
    assert dev == []
    container.mknod_as_runtime(UVERBS0, "c", 231, 192)
    container.mknod_as_runtime(RDMA_CM, "c", 10, 58)
    assert container.open_result(UVERBS0) == "EPERM"  # revoked
    assert container.open_result(RDMA_CM) == "EPERM"
    assert engine.ledger.records() == [] and engine.ledger.claims() == []


def test_rdma_cm_stays_while_another_rdma_device_needs_it(
    engine: Engine, container: RuncContainer
) -> None:
    engine.mount(container.id, [GPU0, GPU1], with_rdma=True)
    assert {"uverbs0", "uverbs1", "rdma_cm"} <= set(
        container.exec("ls", "/dev/infiniband").stdout.split()
    )

    engine.unmount(container.id, [GPU0])

    assert container.exec("ls", "/dev/infiniband").stdout.split() == ["rdma_cm", "uverbs1"]
    assert container.open_result(RDMA_CM) == "ENODEV"
    assert container.open_result(UVERBS1) == "OK"


def test_the_in_use_check_covers_the_rdma_node(engine: Engine, container: RuncContainer) -> None:
    engine.mount(container.id, [GPU0], rdma=["rdma/mlx5_1"])
    holder = container.hold(UVERBS1)
    try:
        with pytest.raises(DeviceBusy, match="uverbs1"):
            engine.unmount(container.id, [GPU0])
        # Nothing was taken away: the GPU and the NIC both still open.
        assert container.open_result("/dev/nvidia0") == "ENXIO"
        assert container.open_result(UVERBS1) == "OK"

        done = engine.unmount(container.id, [GPU0], force=True)
        assert sorted(done.unmounted) == sorted([GPU0, "rdma/mlx5_1"]) and done.stopped_pids
    finally:
        holder.kill()
        holder.communicate()  # reaps it and closes its pipe
    assert container.exec("ls", "/dev/infiniband").stdout.split() == []


def test_one_holder_per_nic_and_a_refused_mount_changes_nothing(
    engine: Engine, make_container, mode: str
) -> None:
    first, second = make_container(mode), make_container(mode)
    engine.mount(first.id, [GPU0], with_rdma=True)

    # GPU 1 is free, mlx5_0 is not: neither goes in.
    with pytest.raises(DeviceClaimed, match="mlx5_0"):
        engine.mount(second.id, [GPU1], rdma=["rdma/mlx5_0"])

    assert "nvidia1" not in second.ls_dev()
    assert second.open_result(UVERBS0) == "ENOENT"
    assert {c.device for c in engine.ledger.claims()} == {GPU0, "rdma/mlx5_0"}
    # The other NIC, under its uverbs name, is free.
    engine.mount(second.id, [GPU1], rdma=["rdma/uverbs1"])
    assert second.open_result(UVERBS1) == "OK"


def test_only_rdma_devices_ride_along(engine: Engine, container: RuncContainer) -> None:
    with pytest.raises(InvalidDeviceRef, match="not an RDMA device"):
        engine.mount(container.id, [GPU0], rdma=[GPU1])
    with pytest.raises(InvalidDeviceRef, match="raw major:minor"):
        engine.mount(container.id, [GPU0], rdma=["231:192"])
    assert "nvidia0" not in container.ls_dev()
    assert engine.ledger.records() == []


def test_a_nic_mounted_on_its_own_stays_when_a_gpu_leaves(
    engine: Engine, container: RuncContainer
) -> None:
    engine.mount(container.id, ["rdma/mlx5_0"])
    engine.mount(container.id, [GPU0], with_rdma=True)  # already there: stays its own

    done = engine.unmount(container.id, [GPU0])

    assert done.unmounted == [GPU0]
    assert container.open_result(UVERBS0) == "ENXIO"
