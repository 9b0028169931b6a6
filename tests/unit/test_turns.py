"""The node's turn (agent/books/turns.py): what a turn leaves runs beside its caller, and
the next turn starts only once it has finished, so that it finds the GPUs as free as if
the clean-up had run inside the turn before it."""

from __future__ import annotations

import logging
import threading
import time

import pytest

from agent.books.turns import Turns


def test_work_left_runs_beside_the_caller_and_the_next_turn_waits_for_it() -> None:
    turns = Turns(wait_limit=10)
    release = threading.Event()
    done: list[str] = []

    def clean_up() -> None:
        release.wait(10)
        done.append("clean-up")

    with turns.turn():
        turns.leave("deleting blockers", clean_up)
    # The caller goes on (answers) while the clean-up still runs.
    assert done == []
    entered = threading.Event()

    def next_turn() -> None:
        with turns.turn():
            done.append("next turn")
            entered.set()

    thread = threading.Thread(target=next_turn)
    thread.start()
    assert not entered.wait(0.2), "the next turn started before the clean-up had finished"
    release.set()
    thread.join(10)
    assert done == ["clean-up", "next turn"]


def test_a_failed_clean_up_is_logged_and_holds_up_no_turn(
    caplog: pytest.LogCaptureFixture,
) -> None:
    turns = Turns(wait_limit=10)

    def fails() -> None:
        raise RuntimeError("the API server is gone")

    with caplog.at_level(logging.ERROR, logger="agent.books.turns"):
        with turns.turn():
            turns.leave("deleting blockers", fails)
        with turns.turn():
            pass
    assert "deleting blockers failed" in caplog.text


def test_a_clean_up_that_hangs_holds_the_next_turn_up_to_the_limit_only() -> None:
    turns = Turns(wait_limit=0.2)
    stop = threading.Event()
    with turns.turn():
        turns.leave("deleting blockers", lambda: stop.wait(10))
    started = time.monotonic()
    with turns.turn():
        waited = time.monotonic() - started
    stop.set()
    assert 0.15 < waited < 5


def test_work_left_with_a_delay_waits_for_it_or_for_the_next_turn_whichever_is_first() -> None:
    turns = Turns(wait_limit=10)
    ran: list[float] = []
    started = time.monotonic()
    with turns.turn():
        turns.leave("deleting blockers", lambda: ran.append(time.monotonic() - started), 0.3)
    time.sleep(0.1)
    assert ran == [], "the clean-up ran before its delay"
    time.sleep(0.5)
    assert len(ran) == 1 and ran[0] >= 0.3
    # The next turn cuts a long delay short, and still waits for the work.
    with turns.turn():
        turns.leave("deleting blockers", lambda: ran.append(time.monotonic() - started), 30)
    with turns.turn():
        assert len(ran) == 2
    assert time.monotonic() - started < 5
