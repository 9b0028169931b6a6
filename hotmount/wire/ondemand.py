"""The on-demand calls' wire models (issue 42): a cell asks for its pod's GPU, and says when
it is done; both sides import them (hotmount/wire/schemas.py says why here).

POST .../pods/{pod}/gpu/acquire waits up to `waitSeconds` for the pod's GPU: the answer
is `attached` (the GPUs it holds now) or `waiting` (its place in the node's queue, the
`ticket` to ask again with, and an estimate). POST .../gpu/release says the cell ended
(its GPU may be suspended after the pod's idle time), or with `leave`, that the caller
stopped waiting (Ctrl-C in the notebook): its place is given up at once.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from hotmount.wire.schemas import ContainerName, Model, QueuedRequest, Request

__all__ = ["AcquireRequest", "AcquireResult", "QueuedRequest", "ReleaseRequest", "ReleaseResult"]

# A waiting call holds one of the agent's worker threads: a poll of at most this long, so
# that a full queue (hotmount.io/gpu-on-demand, agent/ondemand/queue.py DEFAULT_LIMIT) of
# callers cannot hold them all for long, and a dropped client is seen within one poll.
MAX_WAIT_SECONDS = 20.0


class AcquireRequest(Request):
    """`waitSeconds`: how long this call may wait for a GPU before answering `waiting`
    (0: answer at once); `ticket`: the place an earlier answer gave, kept by asking again."""

    container: ContainerName | None = None
    wait_seconds: float = Field(default=10.0, ge=0, le=MAX_WAIT_SECONDS)
    ticket: int | None = Field(default=None, ge=1)


class AcquireResult(Model):
    namespace: str | None = None
    pod: str | None = None
    container: str | None = None
    state: Literal["attached", "waiting"]
    devices: list[str] = Field(default_factory=list)  # attached: the GPUs the pod holds
    resumed: dict[str, str] = Field(default_factory=dict)  # suspended GPU -> resumed onto
    ticket: int | None = None  # waiting: the place to ask again with
    position: int | None = None  # waiting: 1 for the next served
    estimate_seconds: float | None = None  # waiting: None when no hold has been seen yet
    waited_seconds: float = 0.0  # since the cell first asked
    # waiting, answered at once because many calls wait already: ask again after this
    retry_after_seconds: float | None = None
    message: str


class ReleaseRequest(Request):
    """`leave`: stop waiting (the place given up); otherwise the cell ended."""

    container: ContainerName | None = None
    leave: bool = False


class ReleaseResult(Model):
    namespace: str | None = None
    pod: str | None = None
    state: Literal["idle", "left", "unknown"]
    message: str
