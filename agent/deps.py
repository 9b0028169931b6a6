"""FastAPI dependencies: the service, the caller's identity, the authorizer, the gateway."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Depends, Request

from agent.auth import Authenticator, Authorizer, CallerContext, Identity
from agent.gateway import Gateway
from agent.service import NodeService

PEER_CERT_KEY = "hotmount.peer_cert"
PEER_UID_KEY = "hotmount.peer_uid"
LISTENER_KEY = "hotmount.listener"
IDENTITY_KEY = "hotmount.identity"  # set by agent/guard.py before the route runs


def caller_context(request: Request) -> CallerContext:
    headers: dict[str, list[str]] = {}
    for name, value in request.headers.items():
        headers.setdefault(name.lower(), []).append(value)
    scope: dict[str, Any] = request.scope
    return CallerContext(
        headers=headers,
        listener=scope.get(LISTENER_KEY, "tcp"),
        peer_cert=scope.get(PEER_CERT_KEY),
        peer_uid=scope.get(PEER_UID_KEY),
    )


def _identity(request: Request) -> Identity:
    identity: Identity | None = request.scope.get(IDENTITY_KEY)
    if identity is None:  # an app without the guard: authenticate here
        authenticator: Authenticator = request.app.state.authenticator
        identity = authenticator.authenticate(caller_context(request))
    request.state.user = identity.name
    return identity


def _service(request: Request) -> NodeService:
    return request.app.state.service


def _authorizer(request: Request) -> Authorizer:
    return request.app.state.authorizer


def _gateway(request: Request) -> Gateway | None:
    return request.app.state.gateway


Caller = Annotated[Identity, Depends(_identity)]
Service = Annotated[NodeService, Depends(_service)]
Authz = Annotated[Authorizer, Depends(_authorizer)]
Gate = Annotated[Gateway | None, Depends(_gateway)]
