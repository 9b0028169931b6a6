"""The progress of a suspend or resume on a terminal (issue 33): while the POST runs, a
thread polls GET on the same path (agent/suspend/progress.py says why a GET rather
than a streamed answer) and prints a line each time the counts change:

    suspend: 2 CUDA processes, 1.0 GiB of GPU memory
    suspend: locked 2/2 processes
    suspend: checkpointed 1/2 processes, 512 MiB of 1.0 GiB moved to host memory

Only on a terminal, and only for `-o table`: `-o json|yaml` print the result alone. A
failed poll (an older agent without the GET, a proxy's hiccup) prints nothing: the
progress is a courtesy, the POST's answer is what counts.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Any

INTERVAL = 0.5  # seconds between two polls


def size_text(n: int) -> str:
    return f"{n / (1 << 30):.1f} GiB" if n >= 1 << 30 else f"{n >> 20} MiB"


def progress_line(doc: Mapping[str, Any] | None) -> str | None:
    """One line for an OperationProgress document (camelCase JSON); None before the
    processes are counted, or when none runs. Only numbers and known words are printed:
    nothing the agent sent goes to the terminal as text."""
    if not doc or not doc.get("running") or not isinstance(doc.get("processes"), int):
        return None
    op = "resume" if doc.get("op") == "resume" else "suspend"
    n, total = doc["processes"], _int(doc.get("gpuBytes"))
    moved, step = _int(doc.get("movedBytes")), doc.get("step")
    of = f"{size_text(moved)} of {size_text(total)}"
    if op == "suspend":
        if step == "locking":
            return f"suspend: locked {_int(doc.get('locked'))}/{n} processes"
        if step == "checkpointing":
            done = _int(doc.get("checkpointed"))
            return f"suspend: checkpointed {done}/{n} processes, {of} moved to host memory"
        if step in ("unmounting", "unmounted"):
            return f"suspend: {n} processes checkpointed, {of} in host memory; unmounting"
    else:
        if step in ("mounting", "mounted"):
            return f"resume: mounting a GPU for {n} processes"
        if step == "restoring":
            done = _int(doc.get("restored"))
            return f"resume: restored {done}/{n} processes, {of} moved back to GPU memory"
    return f"{op}: {n} CUDA processes, {size_text(total)} of GPU memory"


def _int(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


class Polling:
    """Calls `look()` every `interval` seconds in a thread, and `say(line)` for each new
    line (`progress_line`), until the block ends. `look` raising is a quiet miss."""

    def __init__(
        self,
        look: Callable[[], Mapping[str, Any] | None],
        say: Callable[[str], None],
        interval: float = INTERVAL,
    ) -> None:
        self.look, self.say, self.interval = look, say, interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True, name="nvcli-progress")
        self.lines: list[str] = []

    def __enter__(self) -> Polling:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _poll(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                line = progress_line(self.look())
            except Exception:  # any failure of a courtesy poll is quiet
                continue
            if line and (not self.lines or line != self.lines[-1]) and not self._stop.is_set():
                self.lines.append(line)
                self.say(line)
