"""A tenant's filesystem that never answers (issue 29, item 3; item 11).

The stand-in for an NFS volume whose server the tenant stopped is a FUSE server that
stops answering (tests/support/hung_fuse.py), mounted in the runc container's own
mount namespace. Every call here runs on a thread joined with a bound: without the
fixes it hangs there (the bound fails the test, then the FUSE connection is aborted
so the thread and the container can go).
"""

from __future__ import annotations

import dataclasses
import os
import select
import subprocess
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NamedTuple

import pytest

from hotmount.engine.core import Engine, EngineConfig
from hotmount.engine.results import MountResult, ReconcileReport, UnmountResult
from hotmount.errors import ChildTimeout, DeviceBusy, UnsafePath
from hotmount.tenantfs import forked
from tests.fakes import driver as stand_in
from tests.kernel.conftest import GPU1, NIC0, NIC1
from tests.kernel.test_driver_files import GPU, LIB, _cdi_spec, _rootfs
from tests.support.hung_fuse import HungFuse, hold_file
from tests.support.runc import RuncContainer

BOUND = 60.0  # seconds a call may take here before it counts as hung


@pytest.fixture(autouse=True)
def short_deadline() -> Iterator[None]:
    """The agent's --fs-deadline, short: each bounded failure below costs this long."""
    before = forked.DEFAULT_DEADLINE
    forked.set_default_deadline(3.0)
    yield
    forked.set_default_deadline(before)


@pytest.fixture
def fuse() -> Iterator[HungFuse]:
    server = HungFuse()
    yield server
    server.close()


def _bounded(call: Callable[[], object], seconds: float = BOUND) -> object:
    """`call()` on a thread: its result, or the exception it raised; fails if it hangs."""
    box: dict[str, object] = {}

    def target() -> None:
        try:
            box["result"] = call()
        except BaseException as exc:
            box["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), "the call hung on the tenant's filesystem"
    return box.get("error", box.get("result"))


def _end(*procs: subprocess.Popen[bytes]) -> None:
    for proc in procs:
        proc.kill()
        proc.communicate()


def test_unmount_fails_bounded_when_a_holder_has_a_dev_named_file_on_a_hung_mount(
    engine: Engine, container: RuncContainer, fuse: HungFuse
) -> None:
    """The attack: a file named /dev/... on the tenant's own (dev-capable) FUSE mount,
    held open, then the server stops. The scan may not stat it in the agent's thread;
    it cannot tell whether that fd is a GPU, so the unmount fails, bounded, and changes
    nothing (it never revokes or stops on a guess). A forced one does not wait for it."""
    engine.mount(container.id, [GPU1])
    fuse.mount_in(container.pid, "/dev/hung")
    holder = hold_file(container, "/dev/hung/file")
    try:
        fuse.hang()
        outcome = _bounded(lambda: engine.unmount(container.id, [GPU1]))

        assert isinstance(outcome, ChildTimeout), outcome
        assert "/dev/hung/file (fuse)" in outcome.message
        assert GPU1 in engine.ledger.load(container.id).devices
        assert container.open_result("/dev/nvidia1") == "OK"  # still granted

        # Forced (issue 40): the GPU goes anyway, revoked first; then the process the
        # look could not clear, the hung file's holder, is stopped, and only it.
        forced = _bounded(lambda: engine.unmount(container.id, [GPU1], force=True))
        assert not isinstance(forced, BaseException), forced
        assert forced.unmounted == [GPU1]  # (`ls /dev` would stat the hung mount)
        assert container.open_result("/dev/nvidia1") == "ENOENT"
        assert len(forced.unclassified_pids) == 1
        assert "/dev/hung/file (fuse)" in forced.unclassified_why
        assert set(forced.unclassified_pids) <= set(forced.stopped_pids)  # signalled
        assert container.pid not in forced.stopped_pids
    finally:
        fuse.close()
        _end(holder)


def test_a_nodev_hung_mount_is_skipped_and_real_holders_are_still_named(
    engine: Engine, container: RuncContainer, fuse: HungFuse
) -> None:
    """On a nodev mount no fd can be a device: it is never stat'ed; the scan still names
    the process that holds the GPU, and `force` stops that one alone."""
    engine.mount(container.id, [GPU1])
    fuse.mount_in(container.pid, "/mnt/hung", nodev=True)  # (`ls /dev` would stat it)
    file_holder = hold_file(container, "/mnt/hung/file")
    gpu_holder = container.hold("/dev/nvidia1")
    try:
        fuse.hang()
        busy = _bounded(lambda: engine.unmount(container.id, [GPU1]))

        assert isinstance(busy, DeviceBusy), busy
        assert {h.path for h in busy.holders} == {"/dev/nvidia1"}
        forced = _bounded(lambda: engine.unmount(container.id, [GPU1], force=True))
        assert not isinstance(forced, BaseException), forced
        assert forced.stopped_pids == [h.pid for h in busy.holders]  # the GPU's holder only
        assert file_holder.poll() is None
        assert "nvidia1" not in container.ls_dev()
    finally:
        fuse.close()
        _end(file_holder, gpu_holder)


class Swap(NamedTuple):
    before: str | None  # a tenant's command before the hung filesystem is mounted
    target: str  # where it is mounted in the container
    after: str | None  # a tenant's command after that
    refused: str  # the path the refusal names


# Where the tenant puts its hung filesystem in the path of a node in /dev/infiniband: a
# symlink to it (rm -rf /dev/infiniband; ln -s /mnt/nfs/x /dev/infiniband: no privilege
# needed), or a volume mounted there, over /dev itself, or at a node's own path (a pod
# spec's volumeMounts).
SWAPS = {
    "symlink": Swap(
        None, "/mnt/hung", "rm -rf /dev/infiniband && ln -s /mnt/hung /dev/infiniband",
        "/dev/infiniband",
    ),
    "volume-at-subdir": Swap(None, "/dev/infiniband", None, "/dev/infiniband"),
    "volume-at-dev": Swap(None, "/dev", None, "/dev"),
    "volume-at-node": Swap(
        "rm /dev/infiniband/uverbs0", "/dev/infiniband/uverbs0", None, "/dev/infiniband/uverbs0"
    ),
}  # fmt: skip
# The setns fallback refuses the same below /dev; a hung /dev itself costs it a
# deadline instead (its child is killed: test_a_hung_setns_child_is_killed_...).
CASES = [
    pytest.param(method, swap, id=f"{method}-{swap}")
    for method in ("openat2", "setns")
    for swap in sorted(SWAPS)
    if (method, swap) != ("setns", "volume-at-dev")
]


@pytest.mark.parametrize(("method", "swap"), CASES)
def test_a_node_path_on_a_hung_filesystem_is_refused_not_entered(
    subdir_engine: Engine, container: RuncContainer, fuse: HungFuse, method: str, swap: str
) -> None:
    """Issue 40: node work runs in the agent's own process (no fork per node), so it may
    not enter the tenant's filesystem at all: below the container's /dev nothing is
    followed through a symlink or into another mount, and a /dev that is not a local
    filesystem is refused. Reconcile names the container and goes on, a mount of a
    device whose node lives there is refused (one elsewhere in that directory is made),
    an unmount leaves that node and finishes; each promptly (bounded here by two
    --fs-deadlines, though nothing on this path forks)."""
    engine = Engine(dataclasses.replace(subdir_engine.config, node_method=method))
    tenant = SWAPS[swap]
    engine.mount(container.id, [NIC0])
    if tenant.before is not None:
        container.exec("sh", "-c", tenant.before)
    fuse.mount_in(container.pid, tenant.target)
    if tenant.after is not None:
        container.exec("sh", "-c", tenant.after)
    bound = 2 * forked.DEFAULT_DEADLINE
    try:
        fuse.hang()

        report = _bounded(engine.reconcile, bound)
        assert isinstance(report, ReconcileReport), report
        assert tenant.refused in report.errors[container.id], report.errors
        assert report.recreated == 0

        other = _bounded(lambda: engine.mount(container.id, [NIC1]), bound)
        if tenant.refused == "/dev/infiniband/uverbs0":  # NIC1's node is beside it
            assert isinstance(other, MountResult), other
        else:
            assert isinstance(other, UnsafePath), other
            assert tenant.refused in other.message
            assert NIC1 not in engine.ledger.load(container.id).devices
            assert NIC1 not in {c.device for c in engine.ledger.claims()}

        gone = _bounded(lambda: engine.unmount(container.id, [NIC0]), bound)
        assert isinstance(gone, UnmountResult), gone
        assert gone.unmounted == [NIC0] and gone.removed_nodes == []  # left where it is
        record = engine.ledger.load(container.id)
        assert record is None or NIC0 not in record.devices
        assert fuse.pending == 0, "the agent asked the tenant's filesystem something"
    finally:
        fuse.close()


def test_a_hung_setns_child_is_killed_and_keeps_no_other_calls_pipe_or_lock(
    tmp_path: Path, cdi_dir: Path, container: RuncContainer, fuse: HungFuse
) -> None:
    """Item 11: a fork-then-setns child stuck in the tenant's filesystem (here its /dev
    is the hung mount) holds no copy of another call's pipe write end (that call would
    wait for an EOF for ever) nor of a ledger lock held when it was forked; past its
    deadline it is killed, and the mount fails and is rolled back."""
    forked.set_default_deadline(30.0)  # hung long enough to look at it meanwhile
    engine = Engine(
        EngineConfig(
            cdi_dirs=(str(cdi_dir),), state_dir=tmp_path / "state", use_nvml=False,
            node_method="setns",
        )
    )  # fmt: skip
    fuse.mount_in(container.pid, "/dev")
    fuse.hang()
    other_read, other_write = os.pipe()  # another call's pipe, open while the child forks
    try:
        with engine.ledger.lock("another-container"):
            box: dict[str, object] = {}
            mounting = threading.Thread(
                target=lambda: box.update(outcome=_bounded(
                    lambda: engine.mount(container.id, [GPU1])
                )),
                daemon=True,
            )  # fmt: skip
            mounting.start()
            _wait_until(lambda: fuse.pending > 0, "the child to be stuck in the tenant's /dev")
        # The lock's holder is done with it: nobody else may still hold it.
        relocked = _bounded(lambda: _lock_once(engine), 10)
        assert relocked is True, relocked
        os.close(other_write)
        readable, _, _ = select.select([other_read], [], [], 10)
        assert readable and os.read(other_read, 1) == b"", "a hung child kept a pipe's write end"

        mounting.join(BOUND)
        assert not mounting.is_alive()
        outcome = box["outcome"]
        assert isinstance(outcome, ChildTimeout), outcome
        assert "did not finish within 30s" in outcome.message
        record = engine.ledger.load(container.id)
        assert record is None or GPU1 not in record.devices  # rolled back
    finally:
        fuse.close()
        os.close(other_read)


def _lock_once(engine: Engine) -> bool:
    with engine.ledger.lock("another-container"):
        return True


def _wait_until(condition: Callable[[], bool], what: str) -> None:
    done = threading.Event()
    for _ in range(300):
        if condition():
            return
        done.wait(0.1)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.mark.parametrize("how", ["mounted", "symlinked"])
def test_driver_placement_beside_a_hung_library_directory_goes_on_and_asks_it_nothing(
    tmp_path: Path, mode: str, fuse: HungFuse, how: str
) -> None:
    """Item 3b, issue 40: under auto the placer looks for libcuda.so.1 in the container's
    library directories; one of them is the tenant's hung mount, or a symlink into one.
    RESOLVE_NO_XDEV refuses every step into another mount (a symlink's target included)
    before that mount is asked anything, so the mount goes on with the driver's files
    on the container's own root filesystem. A mount that fails here (a ChildTimeout)
    means the placer did enter the hung mount and only its deadline got it out: that
    is the guarantee broken, not an acceptable outcome (docs/driver.md)."""
    driver_root = stand_in.build_root(tmp_path / "driver")
    cdi = tmp_path / "cdi"
    cdi.mkdir()
    (cdi / "nvidia.yaml").write_text(_cdi_spec(driver_root, tmp_path / "hook").split("  env:")[0])
    auto = Engine(
        EngineConfig(
            cdi_dirs=(str(cdi),), state_dir=tmp_path / "state", use_nvml=False,
            driver_root=str(driver_root), inject_driver="auto",
        )
    )  # fmt: skip
    container = RuncContainer(tmp_path, _rootfs(tmp_path / "image"), mode)
    try:
        if how == "mounted":
            fuse.mount_in(container.pid, "/usr/lib64")
        else:
            fuse.mount_in(container.pid, "/mnt/hung")
            linked = container.exec("sh", "-c", "mkdir -p /usr && ln -s /mnt/hung /usr/lib64")
            assert linked.returncode == 0, linked.stderr
        fuse.hang()
        outcome = _bounded(lambda: auto.mount(container.id, [GPU]))

        # (A ChildTimeout here: the placer entered the hung mount, and only its deadline
        # got it out.)
        assert isinstance(outcome, MountResult), outcome
        assert fuse.pending == 0, "the placer asked the hung filesystem something"
        record = auto.ledger.load(container.id)
        assert record is not None and GPU in record.devices
        assert outcome.driver is not None, "auto found no libcuda: it brings the driver"
        files = outcome.driver["files"]
        assert f"{LIB}/libcuda.so.{stand_in.VERSION}" in files, files
        assert not [f for f in files if f.startswith("/usr/lib64/")], files
        assert "nvidia0" in container.ls_dev()
    finally:
        fuse.close()
        container.stop()
