"""The one door's own promises (hotmount/tenantfs/): nothing followed or crossed unless
a call says why, and a process pinned so that a reused PID never passes for it."""

from __future__ import annotations

import errno
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from hotmount.errors import ContainerNotFound
from hotmount.tenantfs import procfs, signals
from hotmount.tenantfs.resolve import open_at, openat2_available
from tests.support.waiting import wait_for

pytestmark = pytest.mark.skipif(not openat2_available(), reason="no openat2 on this kernel")


@pytest.fixture
def tree(tmp_path: Path) -> Iterator[int]:
    """A directory with `real/`, `link -> real` and `up -> ..`, as an O_PATH fd."""
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to("real")
    fd = os.open(tmp_path, os.O_PATH | os.O_DIRECTORY)
    yield fd
    os.close(fd)


def test_a_symlink_is_followed_only_when_the_call_says_why(tree: int) -> None:
    with pytest.raises(OSError) as refused:
        open_at(tree, "link", os.O_PATH | os.O_DIRECTORY)
    assert refused.value.errno == errno.ELOOP

    fd = open_at(tree, "link", os.O_PATH | os.O_DIRECTORY, follow_symlinks="a test's link")
    os.close(fd)


def test_another_mount_is_entered_only_when_the_call_says_why() -> None:
    root = os.open("/", os.O_PATH | os.O_DIRECTORY)
    try:
        with pytest.raises(OSError) as refused:
            open_at(root, "proc", os.O_PATH | os.O_DIRECTORY)  # procfs: a mount of its own
        assert refused.value.errno == errno.EXDEV

        fd = open_at(root, "proc", os.O_PATH | os.O_DIRECTORY, cross_mounts="procfs itself")
        os.close(fd)
    finally:
        os.close(root)


def test_nothing_beneath_leads_out_of_the_directory(tree: int) -> None:
    with pytest.raises(OSError) as refused:
        open_at(tree, "../..", os.O_PATH | os.O_DIRECTORY)
    assert refused.value.errno == errno.EXDEV  # RESOLVE_BENEATH's answer


def test_a_pinned_process_reads_its_own_entries_and_its_exit_is_seen() -> None:
    child = subprocess.Popen(["sleep", "60"])
    comm = Path(f"/proc/{child.pid}/comm")
    wait_for(lambda: comm.read_text().strip() == "sleep", "the child to exec sleep")
    try:
        with procfs.ProcessDir("/proc", child.pid) as process:
            assert process.read("comm", 64).strip() == b"sleep"
            signals.kill(process.pidfd)
            child.wait()
            with pytest.raises(ContainerNotFound):
                process.check()
            with pytest.raises(ContainerNotFound):  # the directory never becomes another's
                process.read("comm", 64)
    finally:
        child.kill()
        child.wait()


def test_a_process_in_other_cgroups_than_the_container_is_refused() -> None:
    child = subprocess.Popen(["sleep", "60"])
    try:
        seen: list[bytes] = []

        def owns(cgroup: bytes) -> bool:
            seen.append(cgroup)
            return False

        with pytest.raises(ContainerNotFound, match="other cgroups"):
            procfs.ProcessDir("/proc", child.pid, owns)
        assert seen == [Path(f"/proc/{child.pid}/cgroup").read_bytes()]
    finally:
        child.kill()
        child.wait()


def test_an_exited_pid_is_not_pinned() -> None:
    child = subprocess.Popen(["true"])
    child.wait()
    with pytest.raises(ContainerNotFound):
        procfs.ProcessDir("/proc", child.pid)


def test_signals_stop_through_the_pidfd_and_name_only_those_signalled() -> None:
    alive = subprocess.Popen(["sleep", "60"])
    gone = subprocess.Popen(["true"])
    pidfds = {alive.pid: os.pidfd_open(alive.pid), gone.pid: os.pidfd_open(gone.pid)}
    gone.wait()
    try:
        assert signals.stop(pidfds, grace=5.0) == [alive.pid]
        assert alive.wait(timeout=5) == -15  # SIGTERM, within the grace
    finally:
        for fd in pidfds.values():
            os.close(fd)
        alive.kill()
        alive.wait()
