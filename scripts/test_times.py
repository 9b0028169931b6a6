"""Where a test run's time went, from pytest's JUnit XML files (scripts/test.sh writes them).

    python scripts/test_times.py RESULTS.xml... [--slowest N]

Prints, per test directory (tests/agent, tests/k8s, ...), how many tests passed, failed and
were skipped and the seconds their tests took together (under pytest-xdist that sum is
CPU-independent test time across workers, not wall time: scripts/test.sh prints each
phase's wall time beside it), then the N slowest tests, then one closing line
`N passed, N failed, N skipped` for the whole run.
"""

from __future__ import annotations

import argparse
import xml.etree.ElementTree as ET
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Tally:
    passed: int = 0
    failed: int = 0
    skipped: int = 0
    seconds: float = 0.0
    slowest: list[tuple[float, str]] = field(default_factory=list)


def directory(classname: str) -> str:
    """`tests.agent.test_auth` -> `tests/agent`; a test file at the top -> `tests`."""
    parts = classname.split(".")
    return "/".join(parts[:2]) if len(parts) > 2 else parts[0]


def outcome(case: ET.Element) -> str:
    if case.find("failure") is not None or case.find("error") is not None:
        return "failed"
    if case.find("skipped") is not None:
        return "skipped"
    return "passed"


def read(paths: list[str]) -> tuple[dict[str, Tally], list[tuple[float, str]]]:
    tallies: dict[str, Tally] = defaultdict(Tally)
    times: list[tuple[float, str]] = []
    for path in paths:
        if not Path(path).exists():  # a phase that crashed before writing its report
            print(f"no report: {path}")
            continue
        for case in ET.parse(path).getroot().iter("testcase"):
            classname, seconds = case.get("classname", ""), float(case.get("time", "0"))
            tally = tallies[directory(classname)]
            setattr(tally, outcome(case), getattr(tally, outcome(case)) + 1)
            tally.seconds += seconds
            times.append((seconds, f"{classname}::{case.get('name')}"))
    return tallies, sorted(times, reverse=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", nargs="+", help="JUnit XML files")
    parser.add_argument("--slowest", type=int, default=30)
    args = parser.parse_args()
    tallies, times = read(args.results)
    print(f"{'directory':<16} {'passed':>7} {'failed':>7} {'skipped':>8} {'test s':>9}")
    for name in sorted(tallies):
        t = tallies[name]
        print(f"{name:<16} {t.passed:>7} {t.failed:>7} {t.skipped:>8} {t.seconds:>9.0f}")
    print(f"slowest {args.slowest}:")
    for seconds, name in times[: args.slowest]:
        print(f"{seconds:9.1f}s {name}")
    total = Tally()
    for t in tallies.values():
        total.passed, total.failed = total.passed + t.passed, total.failed + t.failed
        total.skipped += t.skipped
    print(f"{total.passed} passed, {total.failed} failed, {total.skipped} skipped")


if __name__ == "__main__":
    main()
