"""Idle reclaim's pure rules (agent/idle.py): durations, the clock, the decision."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from agent.config import AgentSettings
from agent.idle import (
    ANNOTATION,
    IdleClock,
    choose_timeout,
    format_duration,
    parse_duration,
    should_reclaim,
    timeout_of,
)
from agent.schemas import MountRequest


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("90s", 90), ("30m", 1800), ("1h30m", 5400), ("1.5h", 5400), ("2d", 172800), ("1s", 1)],
)
def test_durations_parse(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("30", "not a duration"),  # seconds or minutes? a guess reclaims 60 times too soon
        ("", "not a duration"),
        ("-5m", "not a duration"),
        ("5 m", "not a duration"),
        ("1w", "not a duration"),
        ("0s", "too short"),
        ("500ms", "too short"),
        ("400d", "too long"),
    ],
)
def test_bad_durations_are_refused_with_the_reason(text: str, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        parse_duration(text)


@pytest.mark.parametrize(
    ("seconds", "text"), [(0, "0s"), (90, "1m30s"), (5400, "1h30m"), (86400, "1d"), (59.6, "1m")]
)
def test_durations_format_short(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text


def test_the_request_field_is_validated_at_the_boundary_and_normalised() -> None:
    assert MountRequest(count=1, idle_timeout="90m").idle_timeout == "1h30m"
    assert MountRequest.model_validate({"count": 1, "idleTimeout": "30m"}).idle_timeout == "30m"
    with pytest.raises(ValidationError, match="not a duration"):
        MountRequest.model_validate({"count": 1, "idleTimeout": "30"})


def test_the_node_default_is_off_and_a_bad_one_stops_the_agent() -> None:
    assert AgentSettings().idle_timeout is None
    assert AgentSettings(idle_timeout="45m").idle_timeout == "45m"
    assert AgentSettings(idle_timeout="off").idle_timeout is None
    with pytest.raises(ValidationError, match="not a duration"):
        AgentSettings(idle_timeout="45")


def test_request_beats_annotation_beats_node_default() -> None:
    annotated = {ANNOTATION: "10m"}
    assert choose_timeout("5m", annotated, "1h") == 300
    assert choose_timeout(None, annotated, "1h") == 600
    assert choose_timeout(None, {}, "1h") == 3600
    assert choose_timeout(None, {}, None) is None
    with pytest.raises(ValueError, match=f"pod annotation {ANNOTATION}: 'soon' is not"):
        choose_timeout(None, {ANNOTATION: "soon"}, None)


@pytest.mark.parametrize(
    ("metadata", "timeout"),
    [
        ({}, None),
        ({"idleTimeout": "90"}, 90.0),
        ({"idleTimeout": "x"}, None),
        ({"idleTimeout": "0"}, None),
    ],
)
def test_a_stored_timeout_that_cannot_be_read_never_reclaims(
    metadata: dict[str, str], timeout: float | None
) -> None:
    assert timeout_of(metadata) == timeout


@pytest.mark.parametrize(
    ("timeout", "since", "now", "holders", "reclaim"),
    [
        (60, 0, 60, 0, True),  # exactly the timeout
        (60, 0, 59.9, 0, False),  # not before
        (60, 0, 10_000, 1, False),  # never while anyone holds it
        (None, 0, 10_000, 0, False),  # no timeout: never
        (60, None, 10_000, 0, False),  # never seen idle
    ],
    ids=["at-timeout", "before", "held", "no-timeout", "not-seen-idle"],
)
def test_the_decision(
    timeout: float | None, since: float | None, now: float, holders: int, reclaim: bool
) -> None:
    assert should_reclaim(timeout, since, now, holders) is reclaim


def test_the_clock_starts_at_the_first_unheld_look_and_a_holder_resets_it() -> None:
    clock = IdleClock()
    assert clock.idle_for("m", 0) is None  # not looked at yet
    assert clock.observe("m", holders=1, now=0) is None
    assert clock.idle_for("m", 5) == 0  # held at the last look
    assert clock.observe("m", holders=0, now=10) == 10  # first unheld look: the clock starts
    assert clock.observe("m", holders=0, now=20) == 10  # and keeps running
    assert clock.idle_for("m", 25) == 15
    assert clock.observe("m", holders=2, now=30) is None  # held again: reset
    assert clock.observe("m", holders=0, now=40) == 40


def test_a_restart_never_makes_a_gpu_look_idle_longer_than_it_was() -> None:
    """The clock lives in memory: a new process starts it at its own first look, so a GPU
    idle for an hour before a restart counts from the restart (less, never more)."""
    before = IdleClock()
    before.observe("m", holders=0, now=0)
    assert before.idle_for("m", 3600) == 3600
    after = IdleClock()  # the agent restarted at 3600
    since = after.observe("m", holders=0, now=3601)
    assert since == 3601
    assert not should_reclaim(60, since, 3601 + 59, holders=0)
    assert should_reclaim(60, since, 3601 + 60, holders=0)


def test_retain_drops_the_clocks_of_mounts_that_are_gone() -> None:
    clock = IdleClock()
    clock.observe("a", 0, 0)
    clock.observe("b", 0, 0)
    clock.retain(["a"])
    assert clock.idle_for("a", 1) == 1 and clock.idle_for("b", 1) is None
