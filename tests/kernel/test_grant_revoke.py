"""Grant and revoke on real runc containers, cgroup v1 (hybrid) and v2."""

from __future__ import annotations

import subprocess
from collections.abc import Callable

import pytest

from hotmount.engine.core import Engine
from hotmount.errors import KernelError
from tests.kernel.conftest import GPU0, GPU1
from tests.support.runc import RuncContainer


def test_fresh_node_is_created_granted_then_removed_and_revoked(
    engine: Engine, container: RuncContainer
) -> None:
    assert container.open_result("/dev/nvidia0") == "ENOENT"

    result = engine.mount(container.id, [GPU0])

    assert [d.key for d in result.mounted] == [GPU0]
    # ENXIO: the cgroup let the open through and no driver answered.
    assert container.open_result("/dev/nvidia0") == "ENXIO"
    assert container.open_result("/dev/nvidiactl") == "ENXIO"
    # The runtime's own rules still hold.
    assert container.open_result("/dev/null") == "OK"
    container.mknod_as_runtime("/dev/blk", "b", 7, 0)
    assert container.open_result("/dev/blk") == "EPERM"

    engine.unmount(container.id, [GPU0])

    assert "nvidia0" not in container.ls_dev()
    assert "nvidiactl" not in container.ls_dev()
    container.mknod_as_runtime("/dev/nvidia0", "c", 195, 0)
    assert container.open_result("/dev/nvidia0") == "EPERM"
    assert container.open_result("/dev/null") == "OK"
    assert engine.ledger.records() == []


def test_existing_node_is_granted_and_left_in_place(
    engine: Engine, container: RuncContainer
) -> None:
    container.mknod_as_runtime("/dev/nvidia0", "c", 195, 0)
    assert container.open_result("/dev/nvidia0") == "EPERM"

    engine.mount(container.id, [GPU0])
    assert container.open_result("/dev/nvidia0") == "ENXIO"

    engine.unmount(container.id, [GPU0])
    # Not ours to remove, but ours to revoke.
    assert "nvidia0" in container.ls_dev()
    assert container.open_result("/dev/nvidia0") == "EPERM"


def test_mount_is_idempotent(engine: Engine, container: RuncContainer) -> None:
    first = engine.mount(container.id, [GPU0])
    second = engine.mount(container.id, [GPU0])

    assert [d.key for d in first.mounted] == [GPU0]
    assert second.mounted == [] and [d.key for d in second.already_mounted] == [GPU0]
    assert container.open_result("/dev/nvidia0") == "ENXIO"
    again = engine.unmount(container.id, [GPU0])
    twice = engine.unmount(container.id, [GPU0])
    assert again.unmounted == [GPU0] and twice.not_mounted == [GPU0]


def test_control_nodes_come_with_the_first_device_and_go_with_the_last(
    engine: Engine, container: RuncContainer
) -> None:
    engine.mount(container.id, ["nvidia.com/gpu=0", "nvidia.com/gpu=1"])
    engine.unmount(container.id, ["nvidia.com/gpu=0"])

    assert "nvidiactl" in container.ls_dev()
    assert container.open_result("/dev/nvidiactl") == "ENXIO"
    assert container.open_result("/dev/nvidia1") == "OK"

    engine.unmount(container.id, ["nvidia.com/gpu=1"])
    assert "nvidiactl" not in container.ls_dev()
    assert "nvidia1" not in container.ls_dev()


def test_status_reports_nodes_and_grants_from_the_kernel(
    engine: Engine, container: RuncContainer
) -> None:
    engine.mount(container.id, [GPU0])

    status = engine.status(container.id)

    assert status.running and status.pending is None
    [device] = status.devices
    nodes = {n.path: n for n in device.nodes}
    assert nodes["/dev/nvidia0"].state == "present" and nodes["/dev/nvidia0"].granted
    assert nodes["/dev/nvidiactl"].granted


@pytest.mark.parametrize("mode", ["v1", "v2"])
def test_a_node_that_cannot_be_removed_fails_that_container_not_reconcile(
    engine: Engine, make_container: Callable[[str], RuncContainer], mode: str
) -> None:
    """A container whose /dev turned read-only: its unmount fails with a KernelError that
    names the node, and reconcile reports that one container and goes on to the next
    (a raw OSError from the unlink stopped every pass on the node)."""
    stuck, other = make_container(mode), make_container(mode)
    engine.mount(stuck.id, [GPU0])
    engine.mount(other.id, [GPU1])
    enter = ["nsenter", "-t", str(stuck.pid), "-m", "-p"]
    subprocess.run([*enter, "/bin/busybox", "mount", "-o", "remount,ro", "/dev"], check=True)

    with pytest.raises(KernelError, match=r"/dev/nvidia0.*Read-only"):
        engine.unmount(stuck.id, [GPU0])

    other.exec("rm", "/dev/nvidia1")
    report = engine.reconcile()

    [stuck_key] = [r.key for r in engine.ledger.records() if r.container_id == stuck.id]
    assert "Read-only" in report.errors[stuck_key]
    assert report.checked == 2
    assert other.open_result("/dev/nvidia1") == "OK", "the other container was repaired"
