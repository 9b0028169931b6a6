"""A move of a named GPU from one pod's container to another's.

/v1 `POST /v1/reassign`; the aggregated API's Reassignment, namespaced for a move within
one namespace (what a RoleBinding allows) and cluster-scoped for a move across
namespaces (what the API server lets through only with a ClusterRoleBinding). Every
permission before any work: `delete` on the source, `create` on the target, and `force`
on both when forced. The call runs on the source's node (and the target's: a move
between nodes is refused there, as the target is not its pod).
"""

from __future__ import annotations

from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from agent.aggregated.objects import GROUP_VERSION, VERSION, kube_object
from agent.aggregated.reassignments import NamespacedReassignmentBody, ReassignmentBody
from agent.auth.authorize import Authorizer
from agent.auth.identity import Identity
from agent.operations.placement import Ask, Call
from agent.operations.table import Args, Face, Operation, body, path
from agent.routes.pods import Namespace
from hotmount.wire.schemas import ReassignRequest, ReassignResult


def _ask(move: ReassignRequest, namespace: str | None = None) -> Ask:
    """`namespace`: the Reassignment object's (None: cluster-scoped, or /v1)."""
    source, target = move.from_, move.to
    return Ask(source.namespace, source.pod, move, {"namespace": namespace}, to=target_of(target))


def target_of(ref: Any) -> tuple[str, str]:
    return (ref.namespace, ref.pod)


def _may_move(authz: Authorizer, caller: Identity, ask: Ask) -> None:
    assert ask.to is not None
    source = (ask.namespace, ask.pod)
    authz.require(caller, "delete", *source)
    authz.require(caller, "create", *ask.to)
    authz.require_force(caller, ask.request.force, source, ask.to)


def _reassign(call: Call) -> ReassignResult:
    return call.node.moves.reassign(call.ask.request, call.caller.name, (call.found, call.found_to))


def _wire(ask: Ask) -> dict[str, Any]:
    body: dict[str, Any] = ask.request.model_dump(by_alias=True, exclude_none=True)
    return body


def _object_sent(args: Args, ask: Ask) -> Any:
    return {"apiVersion": GROUP_VERSION, "kind": "Reassignment", "spec": _wire(ask)}


def _object(call: Call, result: Any) -> dict[str, Any]:
    move: ReassignRequest = call.ask.request
    name = f"{move.from_.pod}-to-{move.to.pod}"
    namespace = call.ask.options["namespace"]
    return kube_object("Reassignment", name, result, namespace, spec=_wire(call.ask))


def _created(request: Request, ask: Ask, answer: Any) -> Any:
    return answer if isinstance(answer, Response) else JSONResponse(answer, status_code=201)


def _namespaced(args: Args) -> Ask:
    """A move between two pods of one namespace: what a RoleBinding can allow."""
    made: NamespacedReassignmentBody = args["body"]
    return _ask(made.within(args["namespace"]), args["namespace"])


def _across(args: Args) -> Ask:
    """A move across namespaces: the API server asked for a ClusterRoleBinding already."""
    made: ReassignmentBody = args["body"]
    return _ask(made.spec)


REASSIGN = Operation(
    name="reassign",
    method="POST",
    verb="delete",  # on the source; `create` on the target
    request=ReassignRequest,
    result=ReassignResult,
    run=_reassign,
    kind="Reassignment",
    metric="reassign",
    authorize=_may_move,
    v1=Face(
        "/reassign",
        "reassign",
        (body(ReassignRequest),),
        lambda args: _ask(args["body"]),
        lambda args, ask: _wire(ask),
    ),
    aggregated=[
        Face(
            f"/{VERSION}/namespaces/{{namespace}}/reassignments",
            "create_namespaced_reassignment",
            (path("namespace", Namespace), body(NamespacedReassignmentBody)),
            _namespaced,
            _object_sent,
            _object,
            _created,
            status_code=201,
            doc=_namespaced.__doc__,
        ),
        Face(
            f"/{VERSION}/reassignments",
            "create_reassignment",
            (body(ReassignmentBody),),
            _across,
            _object_sent,
            _object,
            _created,
            status_code=201,
            doc=_across.__doc__,
        ),
    ],
)
