"""Where a pod's call runs, decided before its use case, in the handler's own worker
thread (agent/operations/table.py): the caller authorized here, the pod looked up once,
then the call done here (the use case gets the pod, and its `measure()` starts knowing
the pod is local) or forwarded to the pod's node's agent, whose answer passes through as
it came (agent/routes/forwarding.py).

The receiving agent of a forwarded call authenticates (agent/http/guard.py) and authorizes
the caller itself before it looks at the pod, as for any call: a forwarded call is
trusted no more than a direct one.

Metrics: a call forwarded is counted here once, as `hotmount_operations_total{result=
"forwarded"}`, and as its real result on the agent that does it. A call that fails here
before its operation starts (the pod's lookup, a forward that cannot go) is this agent's
answer, counted as such (agent/common/results.py `measure_failure`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fastapi import Request

from agent.auth.authorize import Authorizer
from agent.auth.identity import Identity
from agent.cluster.gateway import Gateway
from agent.common.results import measure_failure
from agent.errors import ApiError
from agent.kube.client import PodInfo
from agent.node import Node
from agent.routes.forwarding import Forwarded, forward


@dataclass(frozen=True)
class Ask:
    """An operation's request, whichever face it came by: the pod, the operation's own
    request model, its options (container, force, devices...), a move's target pod."""

    namespace: str
    pod: str
    request: Any = None
    options: dict[str, Any] = field(default_factory=dict)
    to: tuple[str, str] | None = None


@dataclass(frozen=True)
class Call:
    """What a handler gets: who asks, what, and the pod(s) found on this node (None: not
    looked up, the use case looks for itself)."""

    caller: Identity
    authz: Authorizer
    node: Node
    ask: Ask
    found: PodInfo | None = None
    found_to: PodInfo | None = None


def place(
    request: Request,
    caller: Identity,
    ask: Ask,
    operation: str | None,
    sent: Callable[[], Any],
    look: bool = True,
) -> Call:
    """The call, to run here; or `Forwarded` raised with the pod's node's answer.
    `operation`: its name in the metrics (None: a read, not counted); `sent`: the body a
    forward sends on; `look`: False when the call is answered here with no look at the pod."""
    state = request.app.state
    node: Node = state.node
    authz: Authorizer = state.authorizer
    if not look:
        return Call(caller, authz, node, ask)
    targets = node.mounting.targets
    with measure_failure(node.metrics, operation):
        found = targets.locate(ask.namespace, ask.pod)
        found_to = None
        if targets.here(found) and ask.to is not None:
            try:
                found_to = targets.locate(*ask.to)
            except ApiError:  # its error comes where the use case looks, after the source's
                found_to = None
        elsewhere = next((p for p in (found, found_to) if p and not targets.here(p)), None)
        if elsewhere is None:
            return Call(caller, authz, node, ask, found, found_to)
        where = elsewhere.node_name or ""
        why = f"pod {elsewhere.namespace}/{elsewhere.name} runs on node {where}"
        gateway: Gateway | None = state.gateway
        answer = Forwarded(forward(request, caller, gateway, where, why, sent()))
    if operation is not None:
        node.metrics.operations.labels(operation, "forwarded").inc()
    raise answer
