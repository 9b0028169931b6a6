"""An operation is one row: what it needs and does, and how each API face spells it.
`register` makes each face's route from the row: a dependency (`asked`) reads the face's
parameters and the caller; the handler then places the call (`place`: authorizes the
caller, looks the pod up once and forwards the call to the pod's node when it lives
elsewhere), all before the use case, which it then runs here, and writes its answer as
the face does.

One worker thread per call: the dependency is a coroutine that does no I/O, and the
placement runs in the handler's own thread. FastAPI gives every sync dependency a
thread of its own; a sync placement beside the sync handler cost each pod call a second
hop between the event loop and a worker thread (two more wake-ups of each, which under
CPU load are each a wait for a core)."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import APIRouter, Body, Depends, Request
from fastapi.responses import JSONResponse, Response

from agent.auth.authorize import Authorizer
from agent.auth.identity import Identity
from agent.http.deps import Caller
from agent.node import Node
from agent.operations.placement import Ask, Call, place
from agent.routes.forwarding import Forwarded

Args = dict[str, Any]
ARG = inspect.Parameter.KEYWORD_ONLY


def path(name: str, annotation: Any) -> inspect.Parameter:
    return inspect.Parameter(name, ARG, annotation=annotation)


def body(model: Any) -> inspect.Parameter:
    return inspect.Parameter("body", ARG, annotation=Annotated[model, Body()])


def dependency(name: str, annotation: Any) -> inspect.Parameter:
    """A parameter FastAPI fills from a dependency of its own (required)."""
    return inspect.Parameter(name, ARG, annotation=annotation)


def query(name: str, annotation: Any, default: Any = None) -> inspect.Parameter:
    return inspect.Parameter(name, ARG, annotation=annotation, default=default)


@dataclass(frozen=True)
class Face:
    """One face's spelling of an operation. `read`: its parameters as the operation's
    Ask (a refusal here comes before any authorization, as a malformed request);
    `sent`: the body a forward sends on; `answer`: the use case's result as this face's
    object; `deliver`: that answer (or the other agent's, forwarded) as it goes out."""

    path: str
    name: str
    params: tuple[inspect.Parameter, ...]
    read: Callable[[Args], Ask]
    sent: Callable[[Args, Ask], Any] = lambda args, ask: None
    answer: Callable[[Call, Any], Any] = lambda call, result: result
    deliver: Callable[[Request, Ask, Any], Any] | None = None
    status_code: int = 200
    doc: str | None = None  # the route's description in /openapi.json


@dataclass(frozen=True)
class Operation:
    """`verb`: what the caller needs on the pod (`authorize` where it needs more);
    `request`/`result`: the operation's own models (the /v1 face's body and answer);
    `run`: the use case; `kind`: the aggregated API's kind; `metric`: its name in
    hotmount_operations_total (None: a read, not counted); `answered_here`: when true,
    the call is answered here with no look at the pod."""

    name: str
    method: str
    verb: str
    request: Any
    result: Any
    run: Callable[[Call], Any]
    kind: str | None = None
    metric: str | None = None
    v1: Face | None = None
    aggregated: Sequence[Face] = ()
    authorize: Callable[[Authorizer, Identity, Ask], None] | None = None
    answered_here: Callable[[Node, Ask], bool] | None = None

    def check(self, authz: Authorizer, caller: Identity, ask: Ask) -> None:
        if self.authorize is not None:
            self.authorize(authz, caller, ask)
        else:
            authz.require(caller, self.verb, ask.namespace, ask.pod)


def register(v1: APIRouter, aggregated: APIRouter, operations: Sequence[Operation]) -> None:
    for op in operations:
        if op.v1 is not None:
            _route(v1, op, op.v1, op.result | Any)
        for face in op.aggregated:
            _route(aggregated, op, face, Any)


def _route(router: APIRouter, op: Operation, face: Face, model: Any) -> None:
    async def asked(request: Request, caller: Identity, **args: Any) -> tuple[Identity, Args]:
        """The caller and the face's parameters, as FastAPI read them; nothing else (a
        coroutine: no worker thread of its own)."""
        return caller, args

    # FastAPI reads a dependency's parameters from its signature: the face's own.
    asked.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [path("request", Request), path("caller", Caller), *face.params]
    )

    def placed(request: Request, caller: Identity, args: Args) -> Call:
        ask = face.read(args)
        node: Node = request.app.state.node
        op.check(request.app.state.authorizer, caller, ask)
        look = op.answered_here is None or not op.answered_here(node, ask)
        try:
            return place(request, caller, ask, op.metric, lambda: face.sent(args, ask), look)
        except Forwarded as forwarded:
            if face.deliver is None:
                raise
            raise Forwarded(_response(face.deliver(request, ask, forwarded.response))) from None

    def endpoint(request: Request, given: tuple[Identity, Args]) -> Any:
        call = placed(request, *given)  # in this thread, before the use case
        answer = face.answer(call, op.run(call))
        return face.deliver(request, call.ask, answer) if face.deliver else answer

    given = Annotated[tuple[Identity, Args], Depends(asked)]
    endpoint.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [path("request", Request), path("given", given)]
    )

    router.add_api_route(
        face.path,
        endpoint,
        methods=[op.method],
        name=face.name,
        status_code=face.status_code,
        response_model=model,
        description=inspect.cleandoc(face.doc) if face.doc else None,
    )


def _response(answer: Any) -> Response:
    return answer if isinstance(answer, Response) else JSONResponse(answer)
