"""Pure decisions of a suspension: whether the node's driver can, how much host memory
is missing, and which free GPU each suspended one resumes onto."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from hotmount.errors import Conflict
from hotmount.suspend.cuda import CUDA_OF_DRIVER_550, CUDA_OF_DRIVER_580
from hotmount.suspend.memory import mib


class CheckpointUnsupported(Conflict):
    """The node's driver cannot do it (no checkpoint API; or, for another GPU, no GPU pairs)."""

    reason = "CheckpointUnsupported"


class InsufficientMemory(Conflict):
    reason = "InsufficientMemory"


class NoGpuFree(Conflict):
    reason = "NoGpuFree"


class ProcessWontLock(Conflict):
    reason = "ProcessWontLock"


class RestoreFailed(Conflict):
    reason = "RestoreFailed"


class NotSuspended(Conflict):
    reason = "NotSuspended"


class AlreadySuspended(Conflict):
    reason = "AlreadySuspended"


def cuda_text(version: int) -> str:
    return f"CUDA {version // 1000}.{version % 1000 // 10}"


def require_checkpoint(version: int) -> None:
    if version < CUDA_OF_DRIVER_550:
        raise CheckpointUnsupported(
            f"the node's driver supports {cuda_text(version)}: suspending a GPU needs CUDA's "
            "checkpoint API, driver 550 (CUDA 12.4) or later"
        )


def require_moves(version: int, moves: dict[str, str]) -> None:
    if moves and version < CUDA_OF_DRIVER_580:
        pairs = ", ".join(f"{old} -> {new}" for old, new in moves.items())
        raise CheckpointUnsupported(
            f"the suspended GPU is not free and restoring onto another ({pairs}) needs "
            f"driver 580 (CUDA 13.0) or later; the node's supports {cuda_text(version)}"
        )


def require_room(need: int, room: int, container: str) -> None:
    if need > room:
        raise InsufficientMemory(
            f"suspending needs {mib(need)} of host memory for the GPU memory of container "
            f"{container}, and its memory cgroup has {mib(room)} free: {mib(need - room)} "
            "missing; nothing was changed"
        )


@dataclass(frozen=True)
class Candidate:
    key: str
    uuid: str
    model: str | None


def targets(
    suspended: list[Candidate], free: Iterable[Candidate], wanted: list[str] | None = None
) -> dict[str, Candidate]:
    """Old key -> the GPU it resumes onto: itself if free, else a free GPU of the same
    model (one GPU each). `wanted`: keys or UUIDs the caller names, tried first, in order.
    NoGpuFree names the model that has none."""
    pool = list(free)
    chosen: dict[str, Candidate] = {}
    asked = list(wanted or [])
    for old in suspended:
        same = [c for c in pool if c.model is not None and c.model == old.model]
        pick = None
        if asked:
            name = asked.pop(0)
            pick = next((c for c in same if name in (c.key, c.uuid)), None)
            if pick is None and name in (old.key, old.uuid):
                pick = next((c for c in pool if c.key == old.key), None)
            if pick is None:
                raise NoGpuFree(
                    f"GPU {name} is not a free GPU of model {old.model or 'unknown'} on this node"
                )
        if pick is None:
            pick = next((c for c in pool if c.key == old.key), None) or (same[0] if same else None)
        if pick is None:
            raise NoGpuFree(f"no GPU of model {old.model or 'unknown'} is free on this node")
        pool.remove(pick)
        chosen[old.key] = pick
    return chosen
