"""FastAPI dependencies: the use cases, the caller's identity, the authorizer, the gateway
(the operation table's routes get theirs from agent/operations/placement.py).

They are `async def`: FastAPI runs a plain `def` dependency in a worker thread, and a
thread hop per dependency per request costs more than the work. None of them blocks
(an identity the guard did not set is found in a worker thread, explicitly).
"""

from __future__ import annotations

from collections.abc import MutableMapping
from typing import Annotated, Any

import anyio.to_thread
from fastapi import Depends, Request

from agent.auth.authenticate import Authenticator
from agent.auth.authorize import Authorizer
from agent.auth.identity import CallerContext, Identity
from agent.cluster.gateway import Gateway
from agent.node import listing, mounting

PEER_CERT_KEY = "hotmount.peer_cert"
PEER_UID_KEY = "hotmount.peer_uid"
LISTENER_KEY = "hotmount.listener"
IDENTITY_KEY = "hotmount.identity"  # set by agent/http/guard.py before the route runs


def caller_context(request: Request) -> CallerContext:
    headers: dict[str, list[str]] = {}
    for name, value in request.headers.items():
        headers.setdefault(name.lower(), []).append(value)
    scope: MutableMapping[str, Any] = request.scope
    return CallerContext(
        headers=headers,
        listener=scope.get(LISTENER_KEY, "tcp"),
        peer_cert=scope.get(PEER_CERT_KEY),
        peer_uid=scope.get(PEER_UID_KEY),
    )


async def request_identity(request: Request) -> Identity:
    """The caller the guard authenticated (or, in an app without the guard, found here)."""
    identity: Identity | None = request.scope.get(IDENTITY_KEY)
    if identity is None:  # an app without the guard: authenticate here
        authenticator: Authenticator = request.app.state.authenticator
        caller = caller_context(request)
        identity = authenticator.authenticate_without_io(caller)
        if identity is None:
            identity = await anyio.to_thread.run_sync(authenticator.authenticate, caller)
    request.state.user = identity.name
    return identity


async def _mounting(request: Request) -> mounting.Mounting:
    use_case: mounting.Mounting = request.app.state.node.mounting
    return use_case


async def _listing(request: Request) -> listing.Listing:
    use_case: listing.Listing = request.app.state.node.listing
    return use_case


async def _authorizer(request: Request) -> Authorizer:
    authorizer: Authorizer = request.app.state.authorizer
    return authorizer


async def _gateway(request: Request) -> Gateway | None:
    gateway: Gateway | None = request.app.state.gateway
    return gateway


Caller = Annotated[Identity, Depends(request_identity)]
Mounting = Annotated[mounting.Mounting, Depends(_mounting)]
Listing = Annotated[listing.Listing, Depends(_listing)]
Authz = Annotated[Authorizer, Depends(_authorizer)]
Gate = Annotated[Gateway | None, Depends(_gateway)]
