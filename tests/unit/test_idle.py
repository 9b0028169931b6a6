"""Idle reclaim's pure rules (agent/idle/policy.py) and the durations it reads and writes
(hotmount/wire/durations.py): the clock, the decision."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from agent.config import AgentSettings
from agent.idle.policy import (
    ANNOTATION,
    IdleClock,
    choose_policy,
    choose_timeout,
    choose_warn_before,
    policy_of,
    reclaim_at,
    should_reclaim,
    should_warn,
    timeout_of,
    warn_before_of,
    warn_lead,
)
from hotmount.wire.durations import format_duration, parse_duration
from hotmount.wire.schemas import MountRequest


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
    ("timeout", "since", "warned", "now", "reclaim"),
    [
        (1800, 0, 1620, 1800, True),  # warned at its lead, due at the timeout
        (1800, 0, 1620, 1799.9, False),  # not before
        (1800, None, 1620, 10_000, False),  # never while in use (the clock reset)
        (None, 0, 1620, 10_000, False),  # no timeout: never
        (1800, 0, None, 10_000, False),  # never without a warning first
        (1800, 0, 5000, 5179, False),  # warned late (a restart): the full lead still given
        (1800, 0, 5000, 5180, True),
    ],
    ids=["at-timeout", "before", "in-use", "no-timeout", "not-warned", "late-warning", "lead"],
)
def test_the_decision(
    timeout: float | None, since: float | None, warned: float | None, now: float, reclaim: bool
) -> None:
    assert should_reclaim(timeout, since, warned, now) is reclaim


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


def test_a_kept_clock_restored_after_a_restart_keeps_its_idle_time_and_warning() -> None:
    """The clock is kept beside the ledger: restored, a GPU idle for an hour before a
    restart is still idle since then; a time in the future (the wall clock went back)
    counts from now: idle for less, never for more."""
    before = IdleClock()
    before.observe("m", holders=0, now=100)
    before.warn("m", now=150)
    after = IdleClock()
    for key, since, warned in before.items():
        after.restore(key, since, warned, now=3700)
    assert after.observe("m", holders=0, now=3701) == 100
    assert after.warned_at("m") == 150
    skewed = IdleClock()
    skewed.restore("m", since=9999, warned_at=9999, now=500)
    assert skewed.idle_for("m", 500) == 0 and skewed.warned_at("m") == 500


def test_use_resets_the_clock_and_its_warning() -> None:
    clock = IdleClock()
    clock.observe("m", holders=0, now=0)
    clock.warn("m", now=50)
    assert clock.observe("m", holders=1, now=60) is None
    assert clock.warned_at("m") is None
    assert clock.observe("m", holders=0, now=70) == 70


@pytest.mark.parametrize(
    ("timeout", "lead"),
    [(3, 3), (30, 30), (600, 60), (1800, 180), (7200, 720)],
    ids=["3s-all", "30s-all", "10m-min-1m", "30m-tenth", "2h-tenth"],
)
def test_the_warning_lead_is_a_tenth_at_least_a_minute_at_most_the_timeout(
    timeout: float, lead: float
) -> None:
    assert warn_lead(timeout) == lead


def test_the_warning_comes_first_and_the_reclaim_never_sooner_than_its_lead() -> None:
    assert not should_warn(1800, 0, None, 1619)
    assert should_warn(1800, 0, None, 1620)  # 3m before the 30m timeout
    assert not should_warn(1800, 0, 1620, 1700)  # once
    assert not should_warn(None, 0, None, 10_000) and not should_warn(1800, None, None, 10_000)
    assert reclaim_at(1800, 0, 1620) == 1800
    # A restart found the clock overdue and unwarned: the warning still gives 3m.
    assert reclaim_at(1800, 0, 5000) == 5180


def test_the_policy_comes_from_the_request_then_the_annotation_then_the_node() -> None:
    annotated = {"hotmount.io/idle-policy": "unused"}
    assert choose_policy("unheld", annotated, "unheld") == "unheld"
    assert choose_policy(None, annotated, "unheld") == "unused"
    assert choose_policy(None, {}, "unused") == "unused"
    with pytest.raises(ValueError, match=r"hotmount\.io/idle-policy: 'idle' is not an idle policy"):
        choose_policy(None, {"hotmount.io/idle-policy": "idle"}, "unheld")
    assert policy_of({}) == "unheld" and policy_of({"idlePolicy": "unused"}) == "unused"


def test_retain_drops_the_clocks_of_mounts_that_are_gone() -> None:
    clock = IdleClock()
    clock.observe("a", 0, 0)
    clock.observe("b", 0, 0)
    clock.retain(["a"])
    assert clock.idle_for("a", 1) == 1 and clock.idle_for("b", 1) is None


def test_warn_before_sets_the_lead_within_the_timeout() -> None:
    assert warn_lead(1800, before=300) == 300  # not the default 3m
    assert warn_lead(30, before=300) == 30  # never more than the timeout
    assert not should_warn(1800, 0, None, 1499, before=300)
    assert should_warn(1800, 0, None, 1500, before=300)
    assert reclaim_at(1800, 0, 5000, before=300) == 5300
    assert should_reclaim(1800, 0, 1500, 1800, before=300)


def test_warn_before_comes_from_the_request_then_the_annotation() -> None:
    annotated = {"hotmount.io/idle-warn-before": "10m"}
    assert choose_warn_before("5m", annotated, 3600) == 300
    assert choose_warn_before(None, annotated, 3600) == 600
    assert choose_warn_before(None, {}, 3600) is None
    with pytest.raises(ValueError, match="must be shorter than the idle timeout 1h"):
        choose_warn_before("1h", {}, 3600)
    with pytest.raises(ValueError, match="needs an idle timeout"):
        choose_warn_before(None, annotated, None)
    with pytest.raises(ValueError, match=r"pod annotation hotmount\.io/idle-warn-before"):
        choose_warn_before(None, {"hotmount.io/idle-warn-before": "soon"}, 3600)
    assert warn_before_of({"warnBefore": "300"}) == 300
    assert warn_before_of({"warnBefore": "x"}) is None and warn_before_of({}) is None


def test_the_suspend_policy_is_judged_by_use_and_validated_at_the_boundary() -> None:
    from pydantic import ValidationError

    from agent.idle.policy import judged_by_use
    from hotmount.wire.schemas import MountRequest

    assert choose_policy(None, {"hotmount.io/idle-policy": " suspend "}, "unheld") == "suspend"
    assert policy_of({"idlePolicy": "suspend"}) == "suspend"
    assert policy_of({"idlePolicy": "hibernate"}) == "unheld"  # unknown: never stops anyone
    assert judged_by_use("suspend") and judged_by_use("unused") and not judged_by_use("unheld")
    assert MountRequest(devices=["0"], idle_policy="suspend").idle_policy == "suspend"
    with pytest.raises(ValidationError, match="'unheld', 'unused' or 'suspend'"):
        MountRequest(devices=["0"], idle_policy="Suspend")
    with pytest.raises(ValueError, match="write unheld, unused, suspend"):
        choose_policy(None, {"hotmount.io/idle-policy": "pause"}, "unheld")
