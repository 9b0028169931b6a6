"""Percentiles and a one-line report; benchmarks print figures, tests never time things."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


def summary(name: str, samples: list[float]) -> str:
    ms = [s * 1000 for s in samples]
    return (
        f"{name:<44} n={len(ms):<5} p50={percentile(ms, 50):8.3f} ms  "
        f"p99={percentile(ms, 99):8.3f} ms  mean={statistics.fmean(ms):8.3f} ms"
    )


def timed(fn: Callable[[], object]) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started
