"""On-demand GPUs (issue 42): a notebook's cell asks for its pod's GPU and says when it
ended (agent/ondemand/arbiter.py).

/v1 `POST .../pods/{pod}/acquire|release`; the aggregated API's GPUMount subresources
`acquire` and `release` (an AcquireRequest or ReleaseRequest as the body): the API server
authorizes `create` on `gpumounts/acquire` or `gpumounts/release`, then the agent asks
`create` on the pod, as a resume does (an acquire mounts or resumes; a release only
starts the idle clock, or gives up a place in the queue).
"""

from __future__ import annotations

from typing import Any

from agent.auth.identity import POD_NAME_EXTRA, Identity
from agent.operations.placement import Call
from agent.operations.suspends import (
    GPUMOUNT,
    NAMESPACE,
    POD,
    V1_POD,
    as_gpumount,
    ask_of,
    sent_body,
)
from agent.operations.table import Face, Operation, body
from hotmount.wire.ondemand import AcquireRequest, AcquireResult, ReleaseRequest, ReleaseResult

DOCS = {
    "acquire": "The pod's on-demand GPU (hotmount.io/gpu-on-demand): attached now, resumed "
    "onto\nany free GPU of its model, or its place in the node's queue after `waitSeconds`.",
    "release": "The pod's cell ended: its on-demand GPU is suspended after the pod's idle "
    "time;\nwith `leave`, the caller stopped waiting and its place is given up.",
}


def caller_of(identity: Identity) -> str:
    """Who holds places in the queue: the user, and for a pod-bound token its pod (the
    notebooks of one namespace share its ServiceAccount; each is a caller of its own)."""
    pods = identity.user.extra.get(POD_NAME_EXTRA)
    return f"{identity.name} (pod {pods[0]})" if pods else identity.name


def _acquire(call: Call) -> AcquireResult:
    ask = call.ask
    return call.node.ondemand.acquire(ask.namespace, ask.pod, ask.request,
                                      caller_of(call.caller), call.found)  # fmt: skip


def _release(call: Call) -> ReleaseResult:
    ask = call.ask
    return call.node.ondemand.release(ask.namespace, ask.pod, ask.request,
                                      caller_of(call.caller), call.found)  # fmt: skip


def _row(op: str, model: Any, result: Any, run: Any) -> Operation:
    params = (NAMESPACE, POD, body(model))
    return Operation(
        name=op,
        method="POST",
        verb="create",
        request=model,
        result=result,
        run=run,
        kind="GPUMount",
        metric=None,  # its mounts, resumes and suspends are counted as those
        v1=Face(f"{V1_POD}/{op}", op, params, ask_of, sent_body, doc=DOCS[op]),
        aggregated=[
            Face(f"{GPUMOUNT}/{op}", f"{op}_gpumount", params, ask_of, sent_body, as_gpumount)
        ],
    )


ACQUIRE = _row("acquire", AcquireRequest, AcquireResult, _acquire)
RELEASE = _row("release", ReleaseRequest, ReleaseResult, _release)
