"""Durations as people write them (`30m`, `90s`, `1h30m`): parsed and printed alike by
the agent (idle timeouts, flags) and nvcli (idle columns, notebook messages), so both
sides of the wire show the same text for the same seconds. Standard library only."""

from __future__ import annotations

import re

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
