"""The on-demand policy a pod asks for (issue 42): its annotations read into one value.

    hotmount.io/gpu-on-demand: "1"                       one GPU, any model on the node
    hotmount.io/gpu-on-demand: "count=2,model=NVIDIA A100-SXM4-80GB"
    hotmount.io/gpu-on-demand-idle: 20s                 suspended after 20 s without a cell
    hotmount.io/gpu-on-demand-priority: "10"            served before lower priorities

Pure: a bad annotation is a ValueError that names it and says what to write, so the
agent refuses the pod's request with that line and changes nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from hotmount.wire.durations import parse_duration

ANNOTATION = "hotmount.io/gpu-on-demand"
IDLE_ANNOTATION = "hotmount.io/gpu-on-demand-idle"
PRIORITY_ANNOTATION = "hotmount.io/gpu-on-demand-priority"
MAX_COUNT = 8  # GPUs one on-demand pod may hold: a node's worth
MAX_PRIORITY = 1000


@dataclass(frozen=True)
class OnDemand:
    count: int = 1
    model: str | None = None  # None: the model of whichever GPU is free
    idle: float | None = None  # seconds without a cell before the suspend; None: the node's
    priority: int = 0


def on_demand_of(annotations: Mapping[str, str]) -> OnDemand | None:
    """The pod's on-demand policy; None if it does not ask for one."""
    raw = annotations.get(ANNOTATION)
    if raw is None:
        return None
    count, model = _request(raw)
    idle = None
    if (text := annotations.get(IDLE_ANNOTATION)) is not None:
        try:
            idle = parse_duration(text)
        except ValueError as exc:
            raise ValueError(f"pod annotation {IDLE_ANNOTATION}: {exc}") from exc
    priority = 0
    if (text := annotations.get(PRIORITY_ANNOTATION)) is not None:
        priority = _number(PRIORITY_ANNOTATION, text, 0, MAX_PRIORITY)
    return OnDemand(count, model, idle, priority)


def _request(raw: str) -> tuple[int, str | None]:
    """`1`, `true`, or `count=N,model=NAME` (either key alone)."""
    value = raw.strip()
    if value.lower() == "true":
        return 1, None
    if value.isdigit():
        return _number(ANNOTATION, value, 1, MAX_COUNT), None
    count, model = 1, None
    for part in value.split(","):
        key, sep, item = part.partition("=")
        key, item = key.strip(), item.strip()
        if not sep or not item or key not in ("count", "model"):
            raise ValueError(
                f"pod annotation {ANNOTATION}: {raw!r} is not an on-demand request: write a "
                'count ("1"), or "count=N,model=NAME"'
            )
        if key == "count":
            count = _number(ANNOTATION, item, 1, MAX_COUNT)
        else:
            model = item
    return count, model


def _number(annotation: str, text: str, low: int, high: int) -> int:
    value = text.strip()
    if not value.isdigit() or not low <= int(value) <= high:
        raise ValueError(
            f"pod annotation {annotation}: {text!r} is not a whole number from {low} to {high}"
        )
    return int(value)
