"""The aggregated API `hotmount.io/v1alpha1`, served behind an APIService.

kubectl and nvcli reach it through the API server with the kubeconfig's own
credentials; the API server authenticates, then forwards the user in
`X-Remote-*` headers (verified in agent/auth.py). Authorization is ours: the same
SubjectAccessReviews as the /v1 API. Discovery documents are open to every
authenticated caller, as Kubernetes' own are.

    GPUMount (namespaced; name = the pod)  create, get, list, delete
    NodeDevices (cluster; name = the node) get, list
    Reassignment (namespaced)               create

The API server authorizes the aggregated path itself before it proxies, by the path's
scope. So a move between two pods of one namespace is a namespaced Reassignment, which a
RoleBinding to `hotmount-user` allows; a move across namespaces is the cluster-scoped
`POST .../reassignments`, which needs `create reassignments` at the cluster scope (a
ClusterRoleBinding). Either way the agent then checks `delete` on the source pod and
`create` on the target (and `force` on both when forced). Listing nodes' devices is
cluster-scoped (`nodedevices`): it shows holders in every namespace.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field

from agent.auth import Authorizer, Identity
from agent.deps import Authz, Caller, Gate, Listing, Mounting, Moves
from agent.errors import BadRequest, NotOnThisNode
from agent.gateway import LOCAL_ONLY, Gateway
from agent.node import moves as node_moves
from agent.routes.forwarding import local_or_forward
from agent.routes.pods import Namespace, PodName
from agent.schemas import KubeName, MountRequest, PodRef, ReassignRequest

GROUP, VERSION = "hotmount.io", "v1alpha1"
GROUP_VERSION = f"{GROUP}/{VERSION}"
PREFIX = f"/apis/{GROUP}"

router = APIRouter(prefix=PREFIX, tags=["aggregated"])


class ObjectMeta(BaseModel):
    model_config = ConfigDict(extra="allow")
    name: str = Field(min_length=1, max_length=253, pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
    namespace: str | None = None


class GPUMountBody(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    api_version: str = Field(
        default=GROUP_VERSION, alias="apiVersion", pattern=f"^{GROUP_VERSION}$"
    )
    kind: str = Field(default="GPUMount", pattern="^GPUMount$")
    metadata: ObjectMeta
    spec: MountRequest


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


def _object(
    kind: str, name: str, status: BaseModel, namespace: str | None = None, spec: Any = None
) -> dict[str, Any]:
    metadata = {"name": name, **({"namespace": namespace} if namespace else {})}
    obj: dict[str, Any] = {"apiVersion": GROUP_VERSION, "kind": kind, "metadata": metadata}
    if spec is not None:
        obj["spec"] = spec
    obj["status"] = status.model_dump(mode="json", by_alias=True)
    return obj


def _other_nodes(request: Request, caller: Identity, gateway: Gateway | None) -> list[Any]:
    """The same list from every other agent, unless this request is one of those asks."""
    if gateway is None or request.headers.get(LOCAL_ONLY):
        return []
    items: list[Any] = []
    for answer in gateway.fan_out(caller, request.url.path):
        if answer.status_code == 200:
            items += answer.json().get("items", [])
    return items


def _list(kind: str, items: list[dict[str, Any]]) -> dict[str, Any]:
    return {"apiVersion": GROUP_VERSION, "kind": f"{kind}List", "metadata": {}, "items": items}


@router.get("")
def api_group(caller: Caller) -> dict[str, Any]:
    version = {"groupVersion": GROUP_VERSION, "version": VERSION}
    return {
        "kind": "APIGroup",
        "apiVersion": "v1",
        "name": GROUP,
        "versions": [version],
        "preferredVersion": version,
    }


@router.get(f"/{VERSION}")
def api_resources(caller: Caller) -> dict[str, Any]:
    return {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": GROUP_VERSION,
        "resources": [
            {
                "name": "gpumounts",
                "singularName": "gpumount",
                "namespaced": True,
                "kind": "GPUMount",
                "verbs": ["create", "delete", "get", "list"],
                "shortNames": ["gm"],
            },
            {
                "name": "nodedevices",
                "singularName": "nodedevices",
                "namespaced": False,
                "kind": "NodeDevices",
                "verbs": ["get", "list"],
            },
            # Namespaced: `kubectl create -n NS -f move.yaml` posts to
            # namespaces/NS/reassignments. The cluster-scoped POST .../reassignments (moves
            # across namespaces) is the same kind at the cluster scope; discovery has one
            # entry per resource name, so it is documented in docs/api.md, not listed twice.
            {
                "name": "reassignments",
                "singularName": "reassignment",
                "namespaced": True,
                "kind": "Reassignment",
                "verbs": ["create"],
            },
        ],
    }


@router.post(f"/{VERSION}/namespaces/{{namespace}}/gpumounts", status_code=201)
def create_gpumount(
    namespace: Namespace,
    body: GPUMountBody,
    request: Request,
    caller: Caller,
    authz: Authz,
    mounting: Mounting,
    gateway: Gate,
) -> Any:
    pod = body.metadata.name
    if body.metadata.namespace not in (None, namespace):
        raise BadRequest(f"metadata.namespace {body.metadata.namespace} is not {namespace}")
    authz.require_mount(caller, namespace, pod, body.spec.share_with, body.spec.force)
    spec = body.spec.model_dump(by_alias=True, exclude_none=True)

    def mount() -> dict[str, Any]:
        result = mounting.mount_pod(namespace, pod, body.spec, caller.name)
        return _object("GPUMount", pod, result, namespace, spec)

    answer = local_or_forward(
        mount, request, caller, gateway, body.model_dump(by_alias=True, exclude_none=True)
    )
    return answer if isinstance(answer, Response) else JSONResponse(answer, status_code=201)


@router.get(f"/{VERSION}/namespaces/{{namespace}}/gpumounts")
def list_gpumounts(
    namespace: Namespace,
    request: Request,
    caller: Caller,
    authz: Authz,
    listing: Listing,
    gateway: Gate,
) -> dict[str, Any]:
    authz.require(caller, "list", namespace)
    items = [
        _object("GPUMount", p.pod or "", p, namespace) for p in listing.namespace_mounts(namespace)
    ]
    return _list("GPUMount", items + _other_nodes(request, caller, gateway))


@router.get(f"/{VERSION}/namespaces/{{namespace}}/gpumounts/{{pod}}")
def get_gpumount(
    namespace: Namespace,
    pod: PodName,
    request: Request,
    caller: Caller,
    authz: Authz,
    listing: Listing,
    gateway: Gate,
) -> Any:
    authz.require(caller, "get", namespace, pod)

    def get() -> dict[str, Any]:
        return _object("GPUMount", pod, listing.pod_devices_here(namespace, pod), namespace)

    return local_or_forward(get, request, caller, gateway)


@router.delete(f"/{VERSION}/namespaces/{{namespace}}/gpumounts/{{pod}}")
def delete_gpumount(
    namespace: Namespace,
    pod: PodName,
    request: Request,
    caller: Caller,
    authz: Authz,
    mounting: Mounting,
    gateway: Gate,
    device: Annotated[list[str] | None, Query(max_length=64)] = None,
    container: Annotated[str | None, Query(pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")] = None,
    force: bool = False,
) -> Any:
    authz.require(caller, "delete", namespace, pod)
    authz.require_force(caller, force, (namespace, pod))

    def delete() -> dict[str, Any]:
        result = mounting.unmount_pod(
            namespace, pod, device or None, container=container, force=force, user=caller.name
        )
        return _object("GPUMount", pod, result, namespace)

    return local_or_forward(delete, request, caller, gateway)


@router.get(f"/{VERSION}/nodedevices")
def list_node_devices(
    request: Request, caller: Caller, authz: Authz, listing: Listing, gateway: Gate
) -> dict[str, Any]:
    authz.require(caller, "list", resource="nodedevices")
    local = listing.devices()
    items = [_object("NodeDevices", local.node or "", local)]
    return _list("NodeDevices", items + _other_nodes(request, caller, gateway))


@router.get(f"/{VERSION}/nodedevices/{{node}}")
def get_node_devices(
    node: PodName, request: Request, caller: Caller, authz: Authz, listing: Listing, gateway: Gate
) -> Any:
    authz.require(caller, "get", name=node, resource="nodedevices")

    def get() -> dict[str, Any]:
        if listing.node_name and node != listing.node_name:
            raise NotOnThisNode(f"node {node} is not this agent's", node)
        return _object("NodeDevices", node, listing.devices())

    return local_or_forward(get, request, caller, gateway)


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
        return _object(
            "Reassignment", f"{spec.from_.pod}-to-{spec.to.pod}", result, namespace, spec=wire
        )

    body = {"apiVersion": GROUP_VERSION, "kind": "Reassignment", "spec": wire}
    answer = local_or_forward(reassign, request, caller, gateway, body)
    return answer if isinstance(answer, Response) else JSONResponse(answer, status_code=201)
