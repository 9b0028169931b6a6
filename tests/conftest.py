"""Suite-wide rule: under CI a kernel test may not skip; the run fails, saying why."""

from __future__ import annotations

import os

import pytest


def pytest_collection_finish(session: pytest.Session) -> None:
    if not os.environ.get("CI"):
        return
    reasons = [
        str(mark.kwargs.get("reason", ""))
        for item in session.items
        for mark in item.iter_markers("skip")
        if "kernel test" in str(mark.kwargs.get("reason", ""))
    ]
    if reasons:
        raise pytest.UsageError(
            f"CI is set but {len(reasons)} kernel tests would skip ({reasons[0]}); "
            "CI runs as root with runc: fix the machine's setup, not the tests"
        )
