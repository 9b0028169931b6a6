"""cgroup v1 `devices.list`: parsing, and the pure emulation of the kernel's allow check.

Table tests under several starting states, as runc's own emulator tests do: a
rule the list already allows is the runtime's and is never written or revoked.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from hotmount.cgroups.v1 import ListEntry, V1Devices, allows, parse_list
from hotmount.devices.model import DeviceRule

ALLOW_ALL = "a *:* rwm\n"

# devices.list of a runc container (runc's default allowed devices, and mknod of any).
RUNC_DEFAULT = """\
c 1:3 rwm
c 1:5 rwm
c 1:7 rwm
c 1:8 rwm
c 1:9 rwm
c 5:0 rwm
c 5:2 rwm
c 136:* rwm
c 10:200 rwm
c *:* m
b *:* m
"""

GRANTED_GPU0 = RUNC_DEFAULT + "c 195:0 rw\nc 195:255 rw\n"
READ_ONLY = "c 195:0 r\n"
DENY_ALL = ""
MAJOR_WILDCARD = "c 195:* rw\n"

STATES = {
    "allow-all": ALLOW_ALL,
    "runc-default": RUNC_DEFAULT,
    "gpu0-granted": GRANTED_GPU0,
    "read-only": READ_ONLY,
    "deny-all": DENY_ALL,
    "major-wildcard": MAJOR_WILDCARD,
}


def rule(line: str) -> DeviceRule:
    """`"c 195:0 rw"` -> the rule it names (the test's own tiny parser, no wildcards)."""
    kind, numbers, letters = line.split()
    major, minor = numbers.split(":")
    access = sum({"m": 1, "r": 2, "w": 4}[c] for c in letters)
    return DeviceRule(kind, int(major), int(minor), access)


# (state, rule, allowed)
CASES = [
    ("allow-all", "c 195:0 rw", True),
    ("allow-all", "c 195:0 rwm", True),
    ("allow-all", "b 8:0 rwm", True),
    ("runc-default", "c 1:3 rwm", True),
    ("runc-default", "c 1:3 r", True),
    ("runc-default", "c 136:0 rw", True),
    ("runc-default", "c 136:4095 rwm", True),
    ("runc-default", "c 137:0 rw", False),
    ("runc-default", "c 195:0 rw", False),
    ("runc-default", "c 195:0 r", False),
    ("runc-default", "c 195:0 m", True),
    ("runc-default", "c 195:0 rm", False),
    ("runc-default", "b 8:0 m", True),
    ("runc-default", "b 8:0 r", False),
    ("runc-default", "b 1:3 rw", False),
    ("runc-default", "c 10:200 rw", True),
    ("runc-default", "c 10:201 rw", False),
    ("gpu0-granted", "c 195:0 rw", True),
    ("gpu0-granted", "c 195:0 r", True),
    ("gpu0-granted", "c 195:0 w", True),
    # rw from the grant and m from `c *:* m` is not enough: the kernel's match_exception()
    # wants one entry covering every requested bit (open() asks r/w, mknod() asks m).
    ("gpu0-granted", "c 195:0 rwm", False),
    ("gpu0-granted", "c 195:0 m", True),
    ("gpu0-granted", "c 195:1 rw", False),
    ("gpu0-granted", "c 195:255 rw", True),
    ("read-only", "c 195:0 r", True),
    ("read-only", "c 195:0 rw", False),
    ("read-only", "c 195:0 w", False),
    ("read-only", "c 195:0 m", False),
    ("deny-all", "c 1:3 r", False),
    ("deny-all", "c 195:0 m", False),
    ("major-wildcard", "c 195:7 rw", True),
    ("major-wildcard", "c 195:1048575 r", True),
    ("major-wildcard", "c 196:7 rw", False),
    ("major-wildcard", "b 195:7 rw", False),
    ("major-wildcard", "c 195:7 rwm", False),
]


@pytest.mark.parametrize(
    ("state", "line", "allowed"),
    CASES,
    ids=[f"{state}:{line.replace(' ', '_')}" for state, line, _ in CASES],
)
def test_allows(state: str, line: str, allowed: bool) -> None:
    assert allows(parse_list(STATES[state]), rule(line)) is allowed


def test_a_rule_needs_one_entry_covering_all_its_access() -> None:
    # The kernel checks each entry on its own: "r" here and "w" there is not "rw"...
    entries = parse_list("c 195:0 r\nc 195:0 w\n")
    assert not allows(entries, rule("c 195:0 rw"))
    assert allows(entries, rule("c 195:0 r"))
    assert allows(entries, rule("c 195:0 w"))


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("a *:* rwm", [ListEntry("a", None, None, 7)]),
        ("c 136:* rwm", [ListEntry("c", 136, None, 7)]),
        ("c *:* m", [ListEntry("c", None, None, 1)]),
        ("b *:5 r", [ListEntry("b", None, 5, 2)]),
        ("c 195:0 rw\nc 195:255 w\n", [ListEntry("c", 195, 0, 6), ListEntry("c", 195, 255, 4)]),
        ("\n  \nc 1:3 rwm\ngarbage\nc 1:5\n", [ListEntry("c", 1, 3, 7)]),
        ("", []),
    ],
    ids=["allow-all", "minor-wildcard", "both-wildcards-mknod", "major-wildcard", "two-lines",
         "skips-malformed-lines", "empty"],
)  # fmt: skip
def test_parse_list(text: str, expected: list[ListEntry]) -> None:
    assert parse_list(text) == expected


def test_parse_list_refuses_unknown_access_letters() -> None:
    with pytest.raises(ValueError, match="only r, w and m"):
        parse_list("c 195:0 rx")


@pytest.mark.parametrize("line", ["c 195:0 rw", "c 195:255 rwm", "b 8:0 m", "c 10:200 r"], ids=str)
def test_v1_line_round_trips_through_parse_list(line: str) -> None:
    (entry,) = parse_list(rule(line).v1_line())
    assert entry.covers(rule(line))
    assert rule(line).v1_line() == line


def test_parsed_lists_are_cached_by_text_only(tmp_path: Path) -> None:
    """The parse is cached by the list's text: a list that drifted (the runtime rewrote it)
    reads as it is now, and a caller changing what it got back changes no later parse."""
    (tmp_path / "devices.list").write_text("c 195:0 rw\n")
    v1 = V1Devices(tmp_path)
    assert v1.allows(rule("c 195:0 rw"))
    (tmp_path / "devices.list").write_text("c 1:3 rwm\n")
    assert not v1.allows(rule("c 195:0 rw"))

    got = parse_list("c 195:0 rw\n")
    got.clear()
    assert parse_list("c 195:0 rw\n") == [ListEntry("c", 195, 0, 6)]
