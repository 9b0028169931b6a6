"""cli/progress.py: the line for each OperationProgress document, and the poller that
prints a line only when it changes and stays quiet when a poll fails."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from cli.progress import Polling, progress_line

GIB = 1 << 30


def doc(op: str = "suspend", **fields: Any) -> dict[str, Any]:
    return {"op": op, "running": True, "processes": 2, "gpuBytes": GIB, **fields}


@pytest.mark.parametrize(
    ("given", "line"),
    [
        (None, None),
        (doc(running=False), None),
        (doc(processes=None, step="starting"), None),  # not counted yet
        (doc(step="starting"), "suspend: 2 CUDA processes, 1.0 GiB of GPU memory"),
        (doc(step="locking", locked=1), "suspend: locked 1/2 processes"),
        (
            doc(step="checkpointing", locked=2, checkpointed=1, movedBytes=GIB // 2),
            "suspend: checkpointed 1/2 processes, 512 MiB of 1.0 GiB moved to host memory",
        ),
        (
            doc(step="unmounting", checkpointed=2, movedBytes=GIB),
            "suspend: 2 processes checkpointed, 1.0 GiB of 1.0 GiB in host memory; unmounting",
        ),
        (doc("resume", step="mounting"), "resume: mounting a GPU for 2 processes"),
        (
            doc("resume", step="restoring", restored=2, movedBytes=GIB),
            "resume: restored 2/2 processes, 1.0 GiB of 1.0 GiB moved back to GPU memory",
        ),
        # an agent's words are never printed: an unknown step is the generic line
        (doc(step="\x1b]0;owned\x07"), "suspend: 2 CUDA processes, 1.0 GiB of GPU memory"),
    ],
    ids=["none", "not-running", "uncounted", "starting", "locking", "checkpointing",
         "unmounting", "mounting", "restoring", "hostile-step"],
)  # fmt: skip
def test_progress_line(given: dict[str, Any] | None, line: str | None) -> None:
    assert progress_line(given) == line


def test_polling_says_each_change_once_and_is_quiet_on_errors() -> None:
    answers: list[Any] = [
        doc(step="locking", locked=1),
        doc(step="locking", locked=1),  # the same: not said again
        RuntimeError("a proxy's hiccup"),
        doc(step="locking", locked=2),
    ]
    said: list[str] = []
    done = threading.Event()

    def look() -> Any:
        if not answers:
            done.set()
            return None
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    with Polling(look, said.append, interval=0.01):
        assert done.wait(10)
    assert said == ["suspend: locked 1/2 processes", "suspend: locked 2/2 processes"]
