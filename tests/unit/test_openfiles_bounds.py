"""The look at open files is bounded in time and in what it answers (issue 40).

The worker's function runs here in the test's own process (a worker runs the same
function): this process holds the fds, /dev/null's (1:3) standing in for a GPU's.
"""

from __future__ import annotations

import os
import pickle
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hotmount.tenantfs import openfiles

PROC = Path("/proc")
NULL = (1, 3)
FAR = 3600.0


@pytest.fixture
def dups() -> Iterator[int]:
    """2,000 fds of one open /dev/null in this process: a small flood."""
    fd = os.open("/dev/null", os.O_RDONLY)
    copies = [os.dup(fd) for _ in range(2000)]
    try:
        yield fd
    finally:
        for copy in [fd, *copies]:
            os.close(copy)


def test_a_holder_of_many_dups_is_one_entry_not_one_per_fd(dups: int) -> None:
    me = os.getpid()
    answer = openfiles._scan(PROC, [me], {NULL}, time.monotonic() + FAR, FAR)
    named, holders, unclassified, why, _remote = answer

    assert (me, "/dev/null") in named and len(named) <= openfiles.PATHS_PER_PID
    assert holders == [me] and unclassified == [] and why == ""
    assert len(pickle.dumps(answer)) < 1024


def test_past_its_budget_a_look_answers_what_it_could_not_finish(dups: int) -> None:
    me = os.getpid()
    named, holders, unclassified, why, _ = openfiles._scan(
        PROC, [me], {NULL}, time.monotonic() - 1, 0.25
    )

    assert (named, holders, unclassified) == ([], [], [me])
    assert f"budget of 0.25s (largest fd tables: PID {me}: " in why


def test_fds_past_the_second_pass_cap_leave_their_process_unclassified(
    dups: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """/dev/null's mount counted as one that may not answer: its fds would each go to the
    second pass; past the cap they are dropped and their process is not classified."""
    monkeypatch.setattr(openfiles, "LOCAL_FILESYSTEMS", frozenset({"proc"}))
    monkeypatch.setattr(openfiles, "MAX_REMOTE", 100)
    me = os.getpid()
    answer = openfiles._scan(PROC, [me], {NULL}, time.monotonic() + FAR, FAR)
    _named, holders, unclassified, why, remote = answer

    assert unclassified == [me] and holders == []
    assert "more open files on network or FUSE mounts than one scan looks at (100)" in why
    assert remote.fds == []
    assert len(pickle.dumps(answer)) < 2048


def test_the_holders_past_the_naming_cap_are_still_holders() -> None:
    found = openfiles._Found()
    for pid in range(openfiles.MAX_NAMED + 10):
        for n in range(2 * openfiles.PATHS_PER_PID):
            found.add(pid, f"/dev/gpu-alias-{n}" + "x" * 1000)

    assert len(found.holders) == openfiles.MAX_NAMED + 10
    assert len(found.named) == openfiles.MAX_NAMED
    assert all(len(p) <= openfiles.MAX_PATH for _, p in found.named)
    assert all(len(paths) == openfiles.PATHS_PER_PID for paths in found.holders.values())
