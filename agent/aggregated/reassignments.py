"""Reassignment: create, a move of devices from one pod to another. Namespaced for a
move within one namespace (what a RoleBinding allows), cluster-scoped for a move across
namespaces (what the API server lets through only with a ClusterRoleBinding)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field

from agent.aggregated.objects import GROUP_VERSION, PREFIX, VERSION, kube_object
from agent.auth import Authorizer, Identity
from agent.deps import Authz, Caller, Gate, Moves
from agent.errors import BadRequest
from agent.gateway import Gateway
from agent.node import moves as node_moves
from agent.routes.forwarding import local_or_forward
from agent.routes.pods import Namespace
from hotmount.wire.schemas import KubeName, PodRef, ReassignRequest

router = APIRouter(prefix=PREFIX, tags=["aggregated"])


class ReassignmentBody(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    api_version: str = Field(
        default=GROUP_VERSION, alias="apiVersion", pattern=f"^{GROUP_VERSION}$"
    )
    kind: str = Field(default="Reassignment", pattern="^Reassignment$")
    metadata: dict[str, Any] | None = None
    spec: ReassignRequest


class LocalPodRef(PodRef):
    """A pod of the Reassignment's own namespace: `namespace` may be left out."""

    namespace: KubeName | None = None  # type: ignore[assignment]


class LocalReassignRequest(ReassignRequest):
    from_: LocalPodRef = Field(alias="from")  # type: ignore[assignment]
    to: LocalPodRef  # type: ignore[assignment]


class NamespacedReassignmentBody(ReassignmentBody):
    spec: LocalReassignRequest  # type: ignore[assignment]

    def within(self, namespace: str) -> ReassignRequest:
        """The move, both pods in `namespace`; a pod elsewhere is a 400 that says where to go."""
        given = (self.metadata or {}).get("namespace")
        if given not in (None, namespace):
            raise BadRequest(f"metadata.namespace {given} is not {namespace}")
        refs = {}
        for side, ref in (("from", self.spec.from_), ("to", self.spec.to)):
            if ref.namespace not in (None, namespace):
                raise BadRequest(
                    f"spec.{side}.namespace {ref.namespace} is not {namespace}: a namespaced "
                    "Reassignment moves within its namespace; across namespaces use the "
                    f"cluster-scoped {PREFIX}/{VERSION}/reassignments"
                )
            refs[side] = {**ref.model_dump(exclude_none=True), "namespace": namespace}
        spec = self.spec.model_dump(by_alias=True, exclude_none=True)
        return ReassignRequest.model_validate({**spec, **refs})


@router.post(f"/{VERSION}/namespaces/{{namespace}}/reassignments", status_code=201)
def create_namespaced_reassignment(
    namespace: Namespace,
    body: NamespacedReassignmentBody,
    request: Request,
    caller: Caller,
    authz: Authz,
    moves: Moves,
    gateway: Gate,
) -> Any:
    """A move between two pods of one namespace: what a RoleBinding can allow."""
    return _reassign(body.within(namespace), request, caller, authz, moves, gateway, namespace)


@router.post(f"/{VERSION}/reassignments", status_code=201)
def create_reassignment(
    body: ReassignmentBody,
    request: Request,
    caller: Caller,
    authz: Authz,
    moves: Moves,
    gateway: Gate,
) -> Any:
    """A move across namespaces: the API server asked for a ClusterRoleBinding already."""
    return _reassign(body.spec, request, caller, authz, moves, gateway)


def _reassign(
    spec: ReassignRequest,
    request: Request,
    caller: Identity,
    authz: Authorizer,
    moves: node_moves.Moves,
    gateway: Gateway | None,
    namespace: str | None = None,
) -> Any:
    """Every permission before any work: delete on the source, create on the target, and
    force on both when forced."""
    source, target = (spec.from_.namespace, spec.from_.pod), (spec.to.namespace, spec.to.pod)
    authz.require(caller, "delete", *source)
    authz.require(caller, "create", *target)
    authz.require_force(caller, spec.force, source, target)
    wire = spec.model_dump(by_alias=True, exclude_none=True)

    def reassign() -> dict[str, Any]:
        result = moves.reassign(spec, caller.name)
        return kube_object(
            "Reassignment", f"{spec.from_.pod}-to-{spec.to.pod}", result, namespace, spec=wire
        )

    body = {"apiVersion": GROUP_VERSION, "kind": "Reassignment", "spec": wire}
    answer = local_or_forward(reassign, request, caller, gateway, body)
    return answer if isinstance(answer, Response) else JSONResponse(answer, status_code=201)
