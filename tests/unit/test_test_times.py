"""scripts/test_times.py: the per-directory table and the closing line CI's log ends with."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "test_times.py"
JUNIT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest">
<testcase classname="tests.agent.test_a" name="test_one" time="2.5"/>
<testcase classname="tests.agent.test_a" name="test_two" time="1.5"><failure/></testcase>
<testcase classname="tests.kernel.test_b" name="test_three" time="7.0"/>
<testcase classname="tests.kernel.test_b" name="test_four" time="0.1"><skipped/></testcase>
<testcase classname="tests.unit.test_c" name="test_five" time="0.2"><error message="y"/></testcase>
</testsuite></testsuites>
"""


def times(*paths: Path) -> list[str]:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), *map(str, paths), "--slowest", "2"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return done.stdout.splitlines()


def test_each_directory_is_counted_and_the_run_closes_with_one_line(tmp_path: Path) -> None:
    report = tmp_path / "run.xml"
    report.write_text(JUNIT)
    lines = times(report)
    rows = {line.split()[0]: line.split()[1:] for line in lines[1:4]}
    assert rows == {
        "tests/agent": ["1", "1", "0", "4"],
        "tests/kernel": ["1", "0", "1", "7"],
        "tests/unit": ["0", "1", "0", "0"],
    }
    assert lines[5].split() == ["7.0s", "tests.kernel.test_b::test_three"]
    assert lines[-1] == "2 passed, 2 failed, 1 skipped"


def test_a_report_a_crashed_lane_never_wrote_is_named_not_fatal(tmp_path: Path) -> None:
    report = tmp_path / "run.xml"
    report.write_text(JUNIT)
    lines = times(tmp_path / "missing.xml", report)
    assert lines[0] == f"no report: {tmp_path / 'missing.xml'}"
    assert lines[-1] == "2 passed, 2 failed, 1 skipped"
