"""PIDs are not identities: force never signals a reused PID, and a lower PID is not init.

Both attacks make the kernel hand out a chosen PID (tests/support/pids.py): node
PID spaces are small (pid_max 32768 here), so wrapping is ordinary, not exotic.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from hotmount.engine.core import Engine, EngineConfig
from hotmount.host import usage
from tests.kernel.conftest import GPU0, GPU1
from tests.support.pids import next_pid_after, pid_exists, spawn_with_pid
from tests.support.runc import RuncContainer
from tests.support.waiting import wait_for

FUSE = (10, 229)  # GPU1's stand-in node, a device with a driver: it can be held open


def gone(pid: int) -> None:
    """Wait until `pid` is reaped and free (bounded): a killed process lingers as a zombie
    until its parent (a `runc exec`, or PID 1 for a container's init) reaps it."""
    wait_for(lambda: not pid_exists(pid), f"PID {pid} to be reaped and free")


@pytest.fixture
def v1(tmp_path: Path, rootfs: Path) -> Iterator[RuncContainer]:
    container = RuncContainer(tmp_path, rootfs, "v1")
    try:
        yield container
    finally:
        container.stop()


def test_force_never_signals_a_pid_reused_after_the_scan(engine: Engine, v1: RuncContainer):
    engine.mount(v1.id, [GPU1])
    holding = v1.hold("/dev/nvidia1")
    container = engine.resolve(v1.id)
    with usage.Pinned.pin(container.pids) as pinned:
        [holder] = pinned.holders(engine.host.proc, {FUSE})
        # The holder exits after the scan and before the signal; its PID goes to a
        # process outside the container, as it may on a busy node.
        os.kill(holder.pid, signal.SIGKILL)
        holding.communicate()  # its `runc exec` reaps it and exits
        gone(holder.pid)
        victim = spawn_with_pid(holder.pid, ["sleep", "1000"])
        try:
            signalled = pinned.stop({holder.pid}, grace=1)

            assert signalled == []
            assert victim.poll() is None, "the process that reused the PID was signalled"
        finally:
            victim.kill()
            victim.wait()


def test_force_stops_the_pinned_holder(engine: Engine, v1: RuncContainer):
    engine.mount(v1.id, [GPU1])
    holding = v1.hold("/dev/nvidia1")
    try:
        result = engine.unmount(v1.id, [GPU1], force=True)
        assert len(result.stopped_pids) == 1
    finally:
        holding.kill()
        holding.communicate()
    assert v1.state()["status"] == "running"


def test_a_pid_that_leaves_the_container_before_it_is_pinned_is_not_pinned(
    v1: RuncContainer,
):
    listed = iter([[v1.pid, os.getpid()], [v1.pid]])  # the cgroup read twice: it moved out
    with usage.Pinned.pin(lambda: next(listed)) as pinned:
        assert pinned.pids == [v1.pid]


def test_an_exec_with_a_lower_pid_does_not_make_reconcile_forget_the_container(
    tmp_path: Path, rootfs: Path, cdi_dir: Path, state_dir: Path
):
    """A shareProcessNamespace pod: the app container's init is not PID 1 of its namespace
    (the pause process is), and a `kubectl exec` after the PIDs wrapped gets a lower PID."""
    config = EngineConfig(cdi_dirs=(str(cdi_dir),), state_dir=state_dir, use_nvml=False)
    pause = RuncContainer(tmp_path, rootfs, "v1")
    app = RuncContainer(tmp_path, rootfs, "v1", share_pid_with=pause)
    session = None
    try:
        Engine(config).mount(app.id, [GPU0])
        for low in (1000, 2000, 300, 5000):
            if low + 50 >= app.pid:
                continue
            with next_pid_after(low):
                session = app.exec_in_background("sleep", "100000")
            app_pids = wait_for(
                lambda: len(pids := _pids(app)) >= 2 and pids,
                "the exec'd process to appear in the app container's cgroup",
                show=lambda: _pids(app),
            )
            if min(app_pids) < app.pid:
                break
            session.kill()
            session.wait()
            session = None
        assert session is not None, f"no exec got a PID below the init's {app.pid}"

        restarted = Engine(config)  # no cache: as after an agent restart
        report = restarted.reconcile()

        assert report.forgotten == [], f"init taken for {min(_pids(app))}, not {app.pid}"
        assert restarted.resolve(app.id).init_pid == app.pid
        assert restarted.ledger.load(app.id) is not None
        assert app.open_result("/dev/nvidia0") == "ENXIO"
    finally:
        if session is not None:
            session.kill()
            session.wait()
        app.stop()
        pause.stop()


def _pids(container: RuncContainer) -> list[int]:
    text = (container.v1_devices_dir / "cgroup.procs").read_text()
    return sorted(int(p) for p in text.split())


def test_a_nested_pid_namespace_does_not_pass_for_the_containers_init(
    tmp_path: Path, rootfs: Path, cdi_dir: Path, state_dir: Path
):
    """In a shareProcessNamespace pod the app's init is not PID 1 of its namespace. A
    tenant starts a process in a PID namespace of its own (`unshare -Urpf`, which a pod
    without a seccomp profile may do): that process *is* PID 1 of its namespace. Taken
    for the init, reconcile (after an agent restart) would forget the live container and
    free its GPU's claim while the container still has the GPU."""
    config = EngineConfig(cdi_dirs=(str(cdi_dir),), state_dir=state_dir, use_nvml=False)
    pause = RuncContainer(tmp_path, rootfs, "v1")
    app = RuncContainer(tmp_path, rootfs, "v1", share_pid_with=pause)
    nested = None
    try:
        Engine(config).mount(app.id, [GPU0])
        # The tenant's process, made from the host: in the app's PID namespace, a new one
        # nested in it (its child is PID 1 there), moved into the app container's cgroups.
        enter = ["nsenter", f"--pid=/proc/{app.pid}/ns/pid", "--"]
        nested = subprocess.Popen(
            [*enter, "unshare", "--pid", "--fork", "--kill-child", "sleep", "1e6"]
        )
        child = _leaf_of(nested.pid)
        assert _nspid(child)[-1] == "1" and len(_nspid(child)) > len(_nspid(app.pid))
        for directory in (app.v1_devices_dir, app.v2_dir):  # every cgroup it inherits
            if (directory / "cgroup.procs").exists():
                (directory / "cgroup.procs").write_text(f"{child}\n")
        assert child in _pids(app)

        restarted = Engine(config)  # no cache: as after an agent restart
        report = restarted.reconcile()

        assert report.forgotten == [], f"init taken for PID {child}, not {app.pid}"
        assert restarted.resolve(app.id).init_pid == app.pid
        assert [c.owner for c in restarted.ledger.claims()] == [app.id]
    finally:
        if nested is not None:
            nested.kill()
            nested.wait()
        app.stop()
        pause.stop()


def _leaf_of(pid: int) -> int:
    """The innermost descendant of `pid`, a chain of single children (bounded wait)."""

    def leaf() -> int | None:
        nonlocal pid
        while children := Path(f"/proc/{pid}/task/{pid}/children").read_text().split():
            pid = int(children[0])
        return pid if Path(f"/proc/{pid}/comm").read_text().strip() == "sleep" else None

    return wait_for(leaf, "the nested process (sleep) to start")


def _nspid(pid: int) -> list[str]:
    status = Path(f"/proc/{pid}/status").read_text().splitlines()
    return next(line.split()[1:] for line in status if line.startswith("NSpid:"))
