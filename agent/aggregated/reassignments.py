"""Reassignment's bodies: namespaced for a move within one namespace (what a RoleBinding
allows), cluster-scoped for a move across namespaces (what the API server lets through
only with a ClusterRoleBinding). Its routes are the table's (agent/operations/reassign.py)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from agent.aggregated.objects import GROUP_VERSION, PREFIX, VERSION
from agent.errors import BadRequest
from hotmount.wire.schemas import KubeName, PodRef, ReassignRequest


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
    from_: LocalPodRef = Field(alias="from")
    to: LocalPodRef


class NamespacedReassignmentBody(ReassignmentBody):
    spec: LocalReassignRequest

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
