"""The progress of the suspensions and resumes this agent is running (issue 33): what
`GET .../suspend` and `GET .../resume` answer while the POST runs.

Why a GET that the caller polls, not a streamed answer to the POST: the POST passes
through the kube-apiserver's aggregation proxy, which may buffer a response and which
ends a request that is not a watch at its --request-timeout; and a client (kubectl,
scripts, the Python client) reads one JSON document as the answer. Short GETs pass
through any proxy unchanged, each one is authorized as the POST is, and the POST's
answer stays the one document it always was.

The engine reports each step (hotmount/engine/suspension.py's `progress` callback); this
module only counts. What it keeps is in memory: a crash ends the request too, and the
ledger's `suspension` is what reconcile reads.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Literal

from hotmount.wire.schemas import OperationProgress

Op = Literal["suspend", "resume"]


@dataclass
class _Running:
    op: Op
    container: str
    started: float = field(default_factory=time.monotonic)
    step: str = "starting"
    processes: int | None = None
    gpu_bytes: int | None = None
    locked: int = 0
    checkpointed: int = 0
    restored: int = 0
    moved_bytes: int = 0


class InFlight:
    """(namespace, pod, op) -> the operation running, updated by the engine's thread and
    read by the GET's; one lock for both."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running: dict[tuple[str, str, Op], _Running] = {}

    @contextmanager
    def track(self, namespace: str, pod: str, op: Op, container: str) -> Iterator[Tracker]:
        """Registers the operation for as long as it runs; yields its `progress` callback."""
        key = (namespace, pod, op)
        running = _Running(op, container)
        with self._lock:
            self._running[key] = running
        try:
            yield Tracker(self._lock, running)
        finally:
            with self._lock:
                if self._running.get(key) is running:
                    del self._running[key]

    def look(self, namespace: str, pod: str, op: Op, container: str | None) -> OperationProgress:
        with self._lock:
            running = self._running.get((namespace, pod, op))
            if running is None or (container and running.container != container):
                return OperationProgress(namespace=namespace, pod=pod, op=op, running=False)
            return OperationProgress(
                namespace=namespace,
                pod=pod,
                op=op,
                running=True,
                container=running.container,
                step=running.step,
                processes=running.processes,
                gpu_bytes=running.gpu_bytes,
                locked=running.locked,
                checkpointed=running.checkpointed,
                restored=running.restored,
                moved_bytes=running.moved_bytes,
                elapsed_seconds=round(time.monotonic() - running.started, 1),
            )


@dataclass(frozen=True)
class Tracker:
    """The engine's `progress(event, details)` callback: counts what each event says."""

    lock: threading.Lock
    running: _Running

    def __call__(self, event: str, details: dict[str, object]) -> None:
        with self.lock:
            r = self.running
            if event == "found":
                r.processes = _int(details.get("processes"))
                r.gpu_bytes = _int(details.get("gpuBytes"))
            elif event == "step":
                r.step = str(details.get("step"))
            elif event == "locked":
                r.locked += 1
            elif event == "checkpointed":
                r.checkpointed += 1
                r.moved_bytes += _int(details.get("gpuBytes")) or 0
            elif event == "restored":
                r.restored += 1
                r.moved_bytes += _int(details.get("gpuBytes")) or 0
            elif event in ("unmounted", "mounted"):
                r.step = event


def _int(value: object) -> int | None:
    return value if isinstance(value, int) else None
