"""A tenant's fd flood cannot keep a GPU, nor swell the agent (issue 40).

The look at a container's open files costs tens of microseconds per fd, and a few
processes holding hundreds of thousands of dup'd fds outlast any `--fs-deadline`. Here
the deadline is short and the flood modest (processes near this machine's
RLIMIT_NOFILE, tests/support/fd_flood.py), so the look cannot finish: an unforced
unmount refuses and changes nothing; a forced one still takes the GPU (grant revoked,
node gone, ledger clear), stopping the holder it found and the processes it could not
clear, and only those; and one look's answer stays small however many fds hold the GPU.
"""

from __future__ import annotations

import pickle
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from hotmount.engine.core import Engine
from hotmount.errors import ChildTimeout
from hotmount.host import usage
from hotmount.host.containers import read_cgroup_pids
from hotmount.tenantfs import forked, workers
from tests.kernel.conftest import GPU1
from tests.support.fd_flood import flood, per_process_limit, roomiest_nofile
from tests.support.pids import pid_exists
from tests.support.runc import RuncContainer
from tests.support.waiting import wait_for

DEADLINE = 0.5  # --fs-deadline: the flood below takes a scan several times longer
NOFILE = roomiest_nofile()  # the container's RLIMIT_NOFILE
FLOOD = 80_000  # fds in all, over as many processes as this machine's limit needs
FUSE = (10, 229)  # GPU1's stand-in node: a device with a driver, so it can be held open


@pytest.fixture
def short_deadline() -> Iterator[None]:
    before = forked.DEFAULT_DEADLINE
    forked.set_default_deadline(DEADLINE)
    yield
    forked.set_default_deadline(before)


@pytest.fixture
def roomy(tmp_path: Path, rootfs: Path, mode: str) -> Iterator[RuncContainer]:
    """A container whose processes may hold as many fds as a runtime's default allows."""
    container = RuncContainer(tmp_path, rootfs, mode, nofile=NOFILE)
    try:
        yield container
    finally:
        container.stop()


def test_a_forced_unmount_takes_the_gpu_from_a_container_that_floods_its_fds(
    engine: Engine, roomy: RuncContainer, short_deadline: None
) -> None:
    engine.mount(roomy.id, [GPU1])
    flooding = flood(roomy, "/dev/null", FLOOD, per_process_limit(NOFILE))
    holder = None
    try:
        # Unforced: who holds the GPU cannot be told, so nothing changes.
        with pytest.raises(ChildTimeout) as refused:
            engine.unmount(roomy.id, [GPU1])
        assert GPU1 in engine.ledger.load(roomy.id).devices
        assert roomy.open_result("/dev/nvidia1") == "OK"

        holder = roomy.hold("/dev/nvidia1")
        [holder_pid] = [
            h.pid for h in usage.holders(engine.host.proc, _small(roomy, flooding.pids), {FUSE})
        ]

        result = engine.unmount(roomy.id, [GPU1], force=True)

        assert result.unmounted == [GPU1]
        assert "nvidia1" not in roomy.ls_dev()
        assert roomy.open_result("/dev/nvidia1") == "ENOENT"
        record = engine.ledger.load(roomy.id)
        assert record is None or GPU1 not in record.devices
        # Stopped: the holder it found, and the flood it could not look at in full.
        assert set(flooding.pids) <= set(result.unclassified_pids)
        assert holder_pid not in result.unclassified_pids
        assert {holder_pid, *flooding.pids} <= set(result.stopped_pids)
        assert f"budget of {DEADLINE / 2:g}s" in result.unclassified_why
        for pid in (holder_pid, *flooding.pids):
            wait_for(lambda pid=pid: not pid_exists(pid), f"PID {pid} to be gone")
        # Nothing else: the container's init, which the look cleared, runs on.
        assert roomy.pid not in result.stopped_pids
        assert roomy.state()["status"] == "running"
        # The refusal said which processes it could not look at, and why: flooding ones
        # (which of them the budget left depends on how far the look got).
        named = {int(pid) for pid in re.findall(r"(\d+) \(sleep\)", refused.value.message)}
        assert named, refused.value.message
        assert named <= set(flooding.pids), (named, flooding.pids)
        assert "largest fd tables" in refused.value.message
    finally:
        flooding.end()
        if holder is not None:
            holder.kill()
            holder.communicate()


def _small(container: RuncContainer, flooding: list[int]) -> list[int]:
    """The container's processes but the flood (quick to look at)."""
    return [p for p in read_cgroup_pids(container.cgroup_dir) if p not in flooding]


@pytest.mark.parametrize("mode", ["v1"])
def test_one_look_answers_in_bounded_size_however_many_fds_hold_the_gpu(
    engine: Engine, roomy: RuncContainer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every fd of the flood is the GPU: a reply of one entry per fd was ~157 MB in the
    agent per million fds. What a worker answers is measured where it is produced."""
    engine.mount(roomy.id, [GPU1])
    count = min(20_000, per_process_limit(NOFILE))
    flooding = flood(roomy, "/dev/nvidia1", count, count)
    sizes: list[int] = []
    real: Callable[..., Any] = workers.call

    def measured(function: Callable[..., Any], args: tuple[Any, ...], *rest: Any) -> Any:
        answer = real(function, args, *rest)
        sizes.append(len(pickle.dumps(answer)))
        return answer

    monkeypatch.setattr(workers, "call", measured)
    try:
        found = usage.holders(engine.host.proc, [roomy.pid, *flooding.pids], {FUSE})

        assert {h.pid for h in found} == set(flooding.pids)
        assert {h.path for h in found} == {"/dev/nvidia1"}
        assert sizes and max(sizes) < 4096, sizes  # not ~30 bytes per fd
    finally:
        flooding.end()


@pytest.mark.parametrize("mode", ["v1"])
def test_a_process_that_got_the_gpu_after_the_look_is_stopped_too(
    engine: Engine,
    roomy: RuncContainer,
    short_deadline: None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Between the look and the revoke a new process opens the GPU (a child inherits
    its flooding parent's fds the same way): the pidfds taken before the look do not
    reach it, so after the revoke the unmount looks again and stops it."""
    engine.mount(roomy.id, [GPU1])
    flooding = flood(roomy, "/dev/null", FLOOD, per_process_limit(NOFILE))
    late: list[Any] = []
    latecomers: list[int] = []
    apply = engine.steps.apply_unmount

    def opened_meanwhile(*args: Any, **kwargs: Any) -> Any:
        before = set(read_cgroup_pids(roomy.cgroup_dir))
        late.append(roomy.hold("/dev/nvidia1"))  # still granted: the revoke comes next
        latecomers.extend(set(read_cgroup_pids(roomy.cgroup_dir)) - before)
        return apply(*args, **kwargs)

    monkeypatch.setattr(engine.steps, "apply_unmount", opened_meanwhile)
    try:
        result = engine.unmount(roomy.id, [GPU1], force=True)

        [latecomer] = latecomers
        assert result.unmounted == [GPU1]
        assert latecomer in result.stopped_pids and latecomer in result.unclassified_pids
        wait_for(lambda: not pid_exists(latecomer), f"PID {latecomer} to be gone")
        assert roomy.state()["status"] == "running"
    finally:
        flooding.end()
        for proc in late:
            proc.kill()
            proc.communicate()
