"""Idle reclaim's pure logic: durations, the idle clock, and the decision to reclaim.

A hot-mounted GPU is idle while no process in its container holds its device node
open (nor shows in NVML's process list). The reconciler looks every pass; this module
decides, with no I/O, so the rules are tested exactly:

- the clock is conservative: a mount's idle time starts at the first look that found
  it unheld (the look's time taken *after* the scan), never earlier, and any holder
  resets it. It lives in memory only, so an agent restart starts every clock again:
  a restart can make a GPU look idle for less time than it was, never for more;
- a GPU is reclaimed only when it has a timeout, nothing holds it now, and it has been
  seen idle for at least that long.
"""

from __future__ import annotations

import re
from collections.abc import Hashable, Iterable

TIMEOUT_KEY = "idleTimeout"  # ledger metadata: the mount's idle timeout, in seconds
MOUNT_ID_KEY = "mountId"  # ledger metadata: one mount, the key of its idle clock
ANNOTATION = "hotmount.io/idle-timeout"
MAX_SECONDS = 366 * 86400

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_WHOLE = re.compile(r"(?:\d+(?:\.\d+)?(?:ms|s|m|h|d))+")


def parse_duration(text: str) -> float:
    """`30m`, `90s`, `1h30m`, `1.5h`, `2d` -> seconds (Go's and kubectl's notation, plus d).

    A bare number is refused: `30` could mean seconds or minutes, and a wrong guess
    reclaims a GPU thirty times too soon.
    """
    value = text.strip()
    if not _WHOLE.fullmatch(value):
        raise ValueError(
            f"{text!r} is not a duration: write a number with a unit, like 30m, 90s or 1h30m"
        )
    seconds = sum(float(number) * _UNITS[unit] for number, unit in _PART.findall(value))
    if seconds < 1:
        raise ValueError(f"{text!r} is too short: an idle timeout is at least 1s")
    if seconds > MAX_SECONDS:
        raise ValueError(f"{text!r} is too long: an idle timeout is at most 366d")
    return seconds


def format_duration(seconds: float) -> str:
    """Seconds as the short form people write: 5400 -> `1h30m`, 90 -> `1m30s`, 0 -> `0s`."""
    left = round(seconds)
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if left >= size:
            parts.append(f"{left // size}{unit}")
            left %= size
    return "".join(parts) or "0s"


def timeout_of(metadata: dict[str, str]) -> float | None:
    """A mount's idle timeout from its ledger metadata; None (never reclaimed) if absent
    or unreadable: a record the agent cannot read is left alone, not reclaimed."""
    raw = metadata.get(TIMEOUT_KEY)
    if not raw:
        return None
    try:
        value = float(raw)
    except ValueError:
        return None
    return value if value > 0 else None


def choose_timeout(
    requested: str | None, annotations: dict[str, str], default: str | None
) -> float | None:
    """The request's `idleTimeout`, else the pod's annotation, else the node's default.

    A bad annotation raises ValueError naming it (the request was validated already)."""
    if requested:
        return parse_duration(requested)
    annotated = annotations.get(ANNOTATION)
    if annotated is not None:
        try:
            return parse_duration(annotated)
        except ValueError as exc:
            raise ValueError(f"pod annotation {ANNOTATION}: {exc}") from exc
    return parse_duration(default) if default else None


def should_reclaim(
    timeout: float | None, idle_since: float | None, now: float, holders: int
) -> bool:
    """Reclaim only a GPU with a timeout, held by nobody now, seen idle for that long."""
    if timeout is None or holders > 0 or idle_since is None:
        return False
    return now - idle_since >= timeout


class IdleClock:
    """When each mount was first seen unheld (monotonic seconds), in memory only.

    Keys name one mount (container, device, mount ID): a GPU unmounted and mounted
    again starts a new clock.
    """

    def __init__(self) -> None:
        self._since: dict[Hashable, float | None] = {}  # None: held at the last look

    def observe(self, key: Hashable, holders: int, now: float) -> float | None:
        """Record one look; returns since when the mount has been idle (None: held).

        `now` must be taken after the scan that counted `holders`: a process that let
        go during the scan then counts as idle from the end of it, not before."""
        if holders > 0:
            self._since[key] = None
            return None
        since = self._since.get(key)
        if since is None:
            since = self._since[key] = now
        return since

    def idle_for(self, key: Hashable, now: float) -> float | None:
        """Seconds idle so far: 0 when held at the last look, None when not looked at yet."""
        if key not in self._since:
            return None
        since = self._since[key]
        return 0.0 if since is None else max(0.0, now - since)

    def forget(self, key: Hashable) -> None:
        self._since.pop(key, None)

    def retain(self, keys: Iterable[Hashable]) -> None:
        """Drop the clocks of mounts that are gone."""
        keep = set(keys)
        self._since = {k: v for k, v in self._since.items() if k in keep}
