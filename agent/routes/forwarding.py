"""Send a call for another node to that node's agent; its answer passes through as it came.

The placement of a pod's call (agent/operations/placement.py) raises `Forwarded` with
that answer before any use case runs; the app answers with it as it is (`install`).
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import Response

from agent.auth.identity import Identity
from agent.cluster.gateway import FORWARDED, Gateway
from agent.errors import NotOnThisNode


class Forwarded(Exception):
    """The answer of the agent the call was forwarded to, for the app to return as it is."""

    def __init__(self, response: Response) -> None:
        super().__init__("forwarded")
        self.response = response


def forward(
    request: Request,
    caller: Identity,
    gateway: Gateway | None,
    node: str,
    why: str,
    body: Any = None,
) -> Response:
    """The call as `node`'s agent answered it. `why` is the NotOnThisNode (421) message
    when it cannot go: this agent has no gateway, or the call was forwarded already (one
    hop: a second would be a loop)."""
    if gateway is None:
        raise NotOnThisNode(why, node)
    if request.headers.get(FORWARDED):
        raise NotOnThisNode(
            f"the pod is on node {node}, and this request was forwarded already", node
        )
    answer = gateway.forward(
        caller,
        node,
        request.method,
        request.url.path,
        list(request.query_params.multi_items()),
        body,
    )
    return Response(
        content=answer.content,
        status_code=answer.status_code,
        media_type=answer.headers.get("content-type", "application/json"),
    )


def install(app: FastAPI) -> None:
    """Answer a forwarded call with the other agent's answer."""

    async def answer(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, Forwarded)
        return exc.response

    app.add_exception_handler(Forwarded, answer)
