"""hotmount/tenantfs/forked.py on real forked processes: answers, errors, fds, the deadline."""

from __future__ import annotations

import os
import time

import pytest

from hotmount.errors import ChildTimeout, KernelError, UnsafePath
from hotmount.tenantfs import forked


def test_the_result_and_the_engines_errors_come_back() -> None:
    assert forked.run(lambda: {"a": [1, 2]}, "work") == {"a": [1, 2]}

    def refuse() -> None:
        raise UnsafePath("/dev/x is a symlink")

    with pytest.raises(UnsafePath, match="/dev/x is a symlink"):
        forked.run(refuse, "work")


def test_a_child_that_dies_without_an_answer_is_a_clear_error() -> None:
    with pytest.raises(KernelError, match="the child died without an answer"):
        forked.run(lambda: os._exit(3), "the step")


def test_the_child_keeps_only_the_fds_it_is_given() -> None:
    kept_r, kept_w = os.pipe()
    other_r, other_w = os.pipe()  # another call's pipe: must not live on in the child
    try:
        seen = forked.run(lambda: {int(n) for n in os.listdir("/proc/self/fd")}, "look",
                          keep=(kept_w,))  # fmt: skip
        assert kept_w in seen
        assert not {kept_r, other_r, other_w} & seen
    finally:
        for fd in (kept_r, kept_w, other_r, other_w):
            os.close(fd)


def test_a_child_past_its_deadline_is_killed_and_reaped() -> None:
    read_end, write_end = os.pipe()

    def hang() -> None:
        os.write(write_end, str(os.getpid()).encode())
        time.sleep(600)

    try:
        with pytest.raises(ChildTimeout, match="the hung step did not finish within 1s"):
            forked.run(hang, "the hung step", keep=(write_end,), deadline=1)
        pid = int(os.read(read_end, 32))
    finally:
        os.close(read_end)
        os.close(write_end)
    with pytest.raises(ChildProcessError):  # gone and reaped: no zombie left
        os.waitpid(pid, os.WNOHANG)
