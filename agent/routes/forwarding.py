"""Turn a NotOnThisNode into the other agent's answer, passed through as it came."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from fastapi import Request
from fastapi.responses import Response

from agent.auth import Identity
from agent.errors import NotOnThisNode
from agent.gateway import FORWARDED, Gateway

T = TypeVar("T")


def local_or_forward(
    call: Callable[[], T],
    request: Request,
    caller: Identity,
    gateway: Gateway | None,
    body: Any = None,
) -> T | Response:
    try:
        return call()
    except NotOnThisNode as exc:
        if gateway is None:
            raise
        if request.headers.get(FORWARDED):  # one hop: a second would be a loop
            raise NotOnThisNode(
                f"the pod is on node {exc.node}, and this request was forwarded already",
                exc.node,
            ) from exc
        answer = gateway.forward(
            caller,
            exc.node,
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
