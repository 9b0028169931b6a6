"""The resolution cache is a hint, never proof: a container ID resolved before is trusted
only after its init is pinned and shown to be the same process, still in the container.

Attacks: the container dies and its init's PID goes to another process (on the host, or
moved into another container's cgroup); a cache entry whose start time is not the
process's. None may grant into the wrong cgroup or create a node anywhere.

The victim that takes a dead init's PID is a host process (not a container's), but one
that a broken cache could not hurt the host through: it sits in throwaway cgroups of
its own (deny-all on v1, so any grant shows in its list; no BPF program on v2) and in a
mount namespace of its own with a private tmpfs on /dev. A node or grant that a broken
cache made lands there, where the assertions see it, never in the host's /dev or the
test runner's cgroup.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from hotmount.engine.core import Engine
from hotmount.errors import ContainerNotFound
from hotmount.host.containers import read_cgroup_pids
from tests.kernel.conftest import GPU0
from tests.kernel.test_pid_reuse import gone
from tests.support.bpf import attached
from tests.support.pids import spawn_with_pid
from tests.support.runc import RuncContainer
from tests.support.waiting import wait_for


def cache_and_stop(engine: Engine, container: RuncContainer) -> int:
    """Mount and unmount once (the ID is now cached), then stop the container: its
    init's PID is free for anyone."""
    engine.mount(container.id, [GPU0])
    engine.unmount(container.id, [GPU0])
    hit = engine.resolver.cached(container.id)
    assert hit is not None, "a resolved container ID is cached"
    init = hit[0].init_pid
    container.stop()
    gone(init)
    return init


# Its own mount namespace, a private tmpfs on /dev, then sleep: one PID throughout.
PRIVATE_DEV = ["unshare", "-m", "--propagation", "private", "sh", "-c"]
PRIVATE_DEV.append("mount -t tmpfs victim-dev /dev && exec sleep 1000")


@dataclass
class Victim:
    proc: subprocess.Popen[bytes]
    v1_dir: Path
    v2_dir: Path

    @property
    def pid(self) -> int:
        return self.proc.pid

    def node_made(self) -> bool:
        return os.path.lexists(f"/proc/{self.pid}/root/dev/nvidia0")  # its /dev: the tmpfs


@contextlib.contextmanager
def victim_with_pid(pid: int) -> Iterator[Victim]:
    """A host process that takes `pid`, in throwaway cgroups (v1 deny-all) and behind
    a private /dev; everything removed afterwards."""
    name = f"hotmount-test-victim-{secrets.token_hex(4)}"
    v1_dir, v2_dir = Path("/sys/fs/cgroup/devices") / name, Path("/sys/fs/cgroup/unified") / name
    proc = spawn_with_pid(pid, PRIVATE_DEV)
    try:
        wait_for(
            lambda: Path(f"/proc/{pid}/comm").read_text().strip() == "sleep",
            f"the victim (PID {pid}) to mount its private /dev and exec sleep",
            interval=0.025,
            show=lambda: Path(f"/proc/{pid}/comm").read_text().strip(),
        )
        assert Path(f"/proc/{pid}/ns/mnt").resolve() != Path("/proc/self/ns/mnt").resolve()
        for directory in (v1_dir, v2_dir):
            directory.mkdir()
            (directory / "cgroup.procs").write_text(str(pid))
        (v1_dir / "devices.deny").write_text("a")
        assert (v1_dir / "devices.list").read_text() == ""
        yield Victim(proc, v1_dir, v2_dir)
    finally:
        proc.kill()
        proc.wait()
        for directory in (v1_dir, v2_dir):
            for _ in range(200):  # a killed task leaves its cgroup a moment after reaping
                try:
                    directory.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.025)


def nothing_granted(engine: Engine, victim: Victim, host_dev: bool) -> None:
    assert engine.ledger.records() == [] and engine.ledger.claims() == []
    assert os.path.lexists("/dev/nvidia0") is host_dev, "a node appeared in the host's /dev"
    assert not victim.node_made(), "a node appeared in the victim's /dev"
    cgroup = Path(f"/proc/{victim.pid}/cgroup").read_text()
    assert "devices" in cgroup  # still alive


@pytest.mark.parametrize("mode", ["v1", "v2"])
def test_a_pid_reused_by_a_host_process_after_a_cached_resolution_gets_nothing(
    engine: Engine, tmp_path: Path, rootfs: Path, mode: str
) -> None:
    host_dev = os.path.lexists("/dev/nvidia0")
    container = RuncContainer(tmp_path, rootfs, mode)
    init = cache_and_stop(engine, container)
    with victim_with_pid(init) as victim:
        with pytest.raises(ContainerNotFound):
            engine.mount(container.id, [GPU0])
        assert engine.resolver.cached(container.id) is None, "the stale entry is dropped"
        nothing_granted(engine, victim, host_dev)
        assert (victim.v1_dir / "devices.list").read_text() == "", "a grant in its cgroup"
        assert attached(victim.v2_dir) == [], "a device program on its cgroup"
        assert read_cgroup_pids(victim.v1_dir) == [victim.pid]  # still where it was put


def test_a_pid_reused_inside_another_container_grants_nothing_there(
    engine: Engine, tmp_path: Path, rootfs: Path
) -> None:
    """The reused PID sits in another live container's cgroups: that container's list
    must not gain the grant meant for the dead one."""
    host_dev = os.path.lexists("/dev/nvidia0")
    dead = RuncContainer(tmp_path, rootfs, "v1")
    other = RuncContainer(tmp_path, rootfs, "v1")
    try:
        init = cache_and_stop(engine, dead)
        with victim_with_pid(init) as victim:
            (other.v1_devices_dir / "cgroup.procs").write_text(str(victim.pid))
            (other.v2_dir / "cgroup.procs").write_text(str(victim.pid))
            before = (other.v1_devices_dir / "devices.list").read_text()
            with pytest.raises(ContainerNotFound):
                engine.mount(dead.id, [GPU0])
            assert (other.v1_devices_dir / "devices.list").read_text() == before
            assert "nvidia0" not in other.ls_dev()
            nothing_granted(engine, victim, host_dev)
    finally:
        other.stop()


def test_an_init_moved_into_another_containers_cgroups_after_a_cached_resolution(
    engine: Engine, make_container
) -> None:
    """Same process, same start time, but now in another container's cgroups: the cached
    directories are not that process's any more, and the other container gains nothing."""
    moved, other = make_container("v1"), make_container("v1")
    engine.mount(moved.id, [GPU0])
    engine.unmount(moved.id, [GPU0])
    assert engine.resolver.cached(moved.id) is not None
    before = (other.v1_devices_dir / "devices.list").read_text()
    for directory in (other.v1_devices_dir, other.v2_dir):
        (directory / "cgroup.procs").write_text(str(moved.pid))

    with pytest.raises(ContainerNotFound):
        engine.mount(moved.id, [GPU0])

    assert (other.v1_devices_dir / "devices.list").read_text() == before
    assert "nvidia0" not in other.ls_dev()
    assert engine.ledger.records() == [] and engine.ledger.claims() == []


def test_a_cache_entry_with_another_start_time_is_dropped_and_resolved_afresh(
    engine: Engine, container: RuncContainer
) -> None:
    """A poisoned entry (its init's start time is not the process's): the engine does
    not use it, resolves the ID again, and mounts into the real container."""
    engine.mount(container.id, [GPU0])
    engine.unmount(container.id, [GPU0])
    cached, start_time = engine.resolver.cached(container.id) or (None, 0)
    assert cached is not None
    wrong_dir = container.v1_devices_dir.parent  # the root: a cgroup we must never use
    engine.resolver.remember(replace(cached, v1_devices_dir=wrong_dir), start_time + 1)

    engine.mount(container.id, [GPU0])

    assert container.open_result("/dev/nvidia0") == "ENXIO"  # granted: no driver behind
    fresh = engine.resolver.cached(container.id)
    assert fresh is not None and fresh == (cached, start_time)
    engine.unmount(container.id, [GPU0])


def test_a_process_in_a_child_cgroup_is_the_containers_on_real_cgroupfs(
    engine: Engine, container: RuncContainer
) -> None:
    """cgroupfs counts subdirectories in st_nlink (a leaf is read without a listing): a
    child cgroup made inside the container, with a process in it, is still walked."""
    directory = container.v2_dir if container.mode == "v2" else container.v1_devices_dir
    child = directory / "inner"
    child.mkdir()
    worker = container.exec_in_background("sleep", "1000")
    try:
        pids = wait_for(
            lambda: len(procs := read_cgroup_pids(directory)) > 1 and procs,
            "the exec'd process to join the container's cgroup",
            show=lambda: read_cgroup_pids(directory),
        )
        moved = max(p for p in pids if p != engine.resolve(container.id).init_pid)
        (child / "cgroup.procs").write_text(str(moved))
        assert read_cgroup_pids(child) == [moved]
        assert moved in read_cgroup_pids(directory)
        assert moved in engine.resolve(container.id).pids()
    finally:
        worker.kill()
        worker.wait()
        for pid in read_cgroup_pids(child):
            with contextlib.suppress(OSError):
                os.kill(pid, 9)
        # kill() only sends SIGKILL: the process leaves the cgroup once it has exited.
        wait_for(
            lambda: not read_cgroup_pids(child),
            "the killed processes to leave the child cgroup",
            timeout=5,
            show=lambda: read_cgroup_pids(child),
        )
        child.rmdir()
