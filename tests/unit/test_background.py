"""Work beside the reconcile pass (agent/common/background.py): the pass starts it and
returns at once; one job per container at a time; a failed job frees its container."""

from __future__ import annotations

import logging
import threading

import pytest

from agent.common.background import Background
from tests.support.waiting import wait_for


def test_a_job_runs_beside_its_starter_one_per_container() -> None:
    background = Background()
    gate = threading.Event()
    ran: list[str] = []

    def job(name: str) -> None:
        gate.wait(timeout=60)
        ran.append(name)

    assert background.start("c1", "first", lambda: job("first"))  # returns at once
    assert background.running("c1") and len(background) == 1
    assert not background.start("c1", "second", lambda: job("second"))  # still running
    assert background.start("c2", "other", lambda: job("other"))  # its own container
    gate.set()
    wait_for(lambda: len(background) == 0, "both jobs to finish")
    assert sorted(ran) == ["first", "other"]
    assert background.start("c1", "again", lambda: job("again"))  # free again
    wait_for(lambda: not background.running("c1"), "the job to finish")


def test_a_failed_job_is_logged_and_frees_its_container(caplog: pytest.LogCaptureFixture) -> None:
    background = Background()

    def failing() -> None:
        raise RuntimeError("the driver went away")

    with caplog.at_level(logging.ERROR, logger="agent.common.background"):
        assert background.start("c1", "idle suspend of c1", failing)
        wait_for(lambda: not background.running("c1"), "the job to end")
    assert "idle suspend of c1 failed" in caplog.text
    assert "the driver went away" in caplog.text
