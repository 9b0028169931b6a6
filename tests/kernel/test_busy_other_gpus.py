"""Unmounting one GPU of several looks only at what leaves (issue 29, item 1).

Two stand-in GPUs with real drivers, so a process in the container can hold them open:
g0 is /dev/fuse's 10:229, g1 /dev/loop-control's 10:237; the control node every GPU
shares, /dev/nvidiactl, is /dev/zero's 1:5. A CUDA process holds nvidiactl and its own
GPU's node: holding nvidiactl says nothing about which GPU it uses, so it counts only
when the container's last GPU leaves (and nvidiactl with it).
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from hotmount.engine.core import Engine, EngineConfig
from hotmount.errors import DeviceBusy, HeldWithStayingDevices
from tests.support.runc import RuncContainer
from tests.support.waiting import wait_for

SPEC = """\
cdiVersion: 0.6.0
kind: example.com/gpu
devices:
  - name: g0
    containerEdits:
      deviceNodes: [{path: /dev/nvidia0, type: c, major: 10, minor: 229}]
  - name: g1
    containerEdits:
      deviceNodes: [{path: /dev/nvidia1, type: c, major: 10, minor: 237}]
containerEdits:
  deviceNodes:
    - {path: /dev/nvidiactl, type: c, major: 1, minor: 5}
"""
G0, G1 = "example.com/gpu=g0", "example.com/gpu=g1"


@pytest.fixture
def engine(tmp_path: Path, state_dir: Path) -> Engine:
    specs = tmp_path / "two-gpus-cdi"
    specs.mkdir()
    (specs / "gpus.yaml").write_text(SPEC)
    return Engine(
        EngineConfig(cdi_dirs=(str(specs),), state_dir=state_dir, use_nvml=False, stop_grace=2)
    )


Hold = Callable[..., subprocess.Popen[bytes]]


@pytest.fixture
def mounted(engine: Engine, make_container: Callable[[str], RuncContainer]) -> RuncContainer:
    container = make_container("v1")
    engine.mount(container.id, [G0, G1])
    return container


@pytest.fixture
def hold(mounted: RuncContainer) -> Iterator[Hold]:
    """A process in the container holding every path given open (`runc exec` lives as
    long as it does); all ended at the test's end."""
    started: list[subprocess.Popen[bytes]] = []

    def holding(*paths: str) -> subprocess.Popen[bytes]:
        opens = " ".join(f"{fd}<>{path}" for fd, path in enumerate(paths, start=3))
        command = ["runc", "--root", str(mounted.state_root), "exec", mounted.id]
        script = f"exec {opens} && echo HELD && exec sleep 100000"
        proc = subprocess.Popen(
            [*command, "sh", "-c", script], stdout=subprocess.PIPE, stdin=subprocess.DEVNULL
        )
        started.append(proc)
        assert proc.stdout is not None and b"HELD" in proc.stdout.readline(), paths
        return proc

    yield holding
    for proc in started:
        proc.kill()
        proc.communicate()


def test_a_process_on_the_other_gpu_and_the_shared_node_does_not_block_an_unmount(
    engine: Engine, mounted: RuncContainer, hold: Hold
) -> None:
    trainer = hold("/dev/nvidia1", "/dev/nvidiactl")

    result = engine.unmount(mounted.id, [G0])

    assert result.unmounted == [G0] and result.stopped_pids == []
    assert "nvidia0" not in mounted.ls_dev()
    assert trainer.poll() is None, "the process on the GPU that stays runs on"
    assert mounted.open_result("/dev/nvidia1") == "OK"
    assert "nvidiactl" in mounted.ls_dev()  # it stays with g1

    # With the last GPU, nvidiactl leaves too: now the same process holds what leaves.
    with pytest.raises(DeviceBusy) as busy:
        engine.unmount(mounted.id, [G1])
    assert {h.path for h in busy.value.holders} == {"/dev/nvidia1", "/dev/nvidiactl"}
    assert G1 in engine.ledger.load(mounted.id).devices


def test_force_stops_only_the_processes_on_the_leaving_gpu(
    engine: Engine, mounted: RuncContainer, hold: Hold
) -> None:
    on_g0 = hold("/dev/nvidia0", "/dev/nvidiactl")
    on_g1 = hold("/dev/nvidia1", "/dev/nvidiactl")
    with pytest.raises(DeviceBusy) as busy:
        engine.unmount(mounted.id, [G0])
    [pid] = {h.pid for h in busy.value.holders}  # g0's process alone

    result = engine.unmount(mounted.id, [G0], force=True)

    assert result.unmounted == [G0] and result.stopped_pids == [pid]
    wait_for(lambda: on_g0.poll() is not None, "the end of g0's process")
    assert on_g1.poll() is None, "the process on the GPU that stays runs on"
    assert mounted.open_result("/dev/nvidia1") == "OK"


def test_force_never_stops_a_process_that_also_uses_a_gpu_that_stays(
    engine: Engine, mounted: RuncContainer, hold: Hold
) -> None:
    both = hold("/dev/nvidia0", "/dev/nvidia1", "/dev/nvidiactl")

    with pytest.raises(HeldWithStayingDevices) as refused:
        engine.unmount(mounted.id, [G0], force=True)

    assert refused.value.http_status == 409 and refused.value.reason == "DeviceBusy"
    [holder] = refused.value.holders
    assert f"PID {holder.pid} ({holder.command}) holds /dev/nvidia0" in refused.value.message
    assert "/dev/nvidia1 (staying)" in refused.value.message
    assert both.poll() is None, "not stopped"
    # Nothing changed: g0 is still mounted, and opens.
    assert G0 in engine.ledger.load(mounted.id).devices
    assert mounted.open_result("/dev/nvidia0") == "OK"
    # Both GPUs leaving together: nothing stays, so force stops it.
    result = engine.unmount(mounted.id, [G0, G1], force=True)
    assert result.stopped_pids == [holder.pid]
    wait_for(lambda: both.poll() is not None, "the end of the process")


def test_a_take_back_stops_a_process_on_both_gpus(
    engine: Engine, mounted: RuncContainer, hold: Hold
) -> None:
    """A take-back (the kubelet gave the GPU to another pod, or counts it free) must take
    it: `spare_staying=False` stops even a process that also uses the GPU that stays."""
    both = hold("/dev/nvidia0", "/dev/nvidia1", "/dev/nvidiactl")

    result = engine.unmount(mounted.id, [G0], force=True, spare_staying=False)

    assert result.unmounted == [G0] and len(result.stopped_pids) == 1
    wait_for(lambda: both.poll() is not None, "the end of the process")
    assert mounted.open_result("/dev/nvidia1") == "OK"
