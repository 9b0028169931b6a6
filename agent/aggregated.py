"""The aggregated API `hotmount.io/v1alpha1`, served behind an APIService.

kubectl and nvcli reach it through the API server with the kubeconfig's own
credentials; the API server authenticates, then forwards the user in
`X-Remote-*` headers (verified in agent/auth.py). Authorization is ours: the same
SubjectAccessReviews as the /v1 API. Discovery documents are open to every
authenticated caller, as Kubernetes' own are.

    GPUMount (namespaced; name = the pod)  create, get, list, delete
    NodeDevices (cluster; name = the node) get, list
    Reassignment (cluster)                  create
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field

from agent.auth import Identity
from agent.deps import Authz, Caller, Gate, Service
from agent.errors import BadRequest, NotOnThisNode
from agent.gateway import LOCAL_ONLY, Gateway
from agent.routes.forwarding import local_or_forward
from agent.routes.pods import Namespace, PodName
from agent.schemas import MountRequest, ReassignRequest

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
            {
                "name": "reassignments",
                "singularName": "reassignment",
                "namespaced": False,
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
    service: Service,
    gateway: Gate,
) -> Any:
    pod = body.metadata.name
    if body.metadata.namespace not in (None, namespace):
        raise BadRequest(f"metadata.namespace {body.metadata.namespace} is not {namespace}")
    authz.require(caller, "create", namespace, pod)
    spec = body.spec.model_dump(by_alias=True, exclude_none=True)

    def mount() -> dict[str, Any]:
        result = service.mount_pod(namespace, pod, body.spec, caller.name)
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
    service: Service,
    gateway: Gate,
) -> dict[str, Any]:
    authz.require(caller, "list", namespace)
    items = [
        _object("GPUMount", p.pod or "", p, namespace) for p in service.namespace_mounts(namespace)
    ]
    return _list("GPUMount", items + _other_nodes(request, caller, gateway))


@router.get(f"/{VERSION}/namespaces/{{namespace}}/gpumounts/{{pod}}")
def get_gpumount(
    namespace: Namespace,
    pod: PodName,
    request: Request,
    caller: Caller,
    authz: Authz,
    service: Service,
    gateway: Gate,
) -> Any:
    authz.require(caller, "get", namespace, pod)

    def get() -> dict[str, Any]:
        service.target_node_check(namespace, pod)
        return _object("GPUMount", pod, service.pod_devices(namespace, pod), namespace)

    return local_or_forward(get, request, caller, gateway)


@router.delete(f"/{VERSION}/namespaces/{{namespace}}/gpumounts/{{pod}}")
def delete_gpumount(
    namespace: Namespace,
    pod: PodName,
    request: Request,
    caller: Caller,
    authz: Authz,
    service: Service,
    gateway: Gate,
    device: Annotated[list[str] | None, Query(max_length=64)] = None,
    container: Annotated[str | None, Query(pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")] = None,
    force: bool = False,
) -> Any:
    authz.require(caller, "delete", namespace, pod)

    def delete() -> dict[str, Any]:
        result = service.unmount_pod(
            namespace, pod, device or None, container=container, force=force, user=caller.name
        )
        return _object("GPUMount", pod, result, namespace)

    return local_or_forward(delete, request, caller, gateway)


@router.get(f"/{VERSION}/nodedevices")
def list_node_devices(
    request: Request, caller: Caller, authz: Authz, service: Service, gateway: Gate
) -> dict[str, Any]:
    authz.require(caller, "list")
    local = service.devices()
    items = [_object("NodeDevices", local.node or "", local)]
    return _list("NodeDevices", items + _other_nodes(request, caller, gateway))


@router.get(f"/{VERSION}/nodedevices/{{node}}")
def get_node_devices(
    node: PodName, request: Request, caller: Caller, authz: Authz, service: Service, gateway: Gate
) -> Any:
    authz.require(caller, "list")

    def get() -> dict[str, Any]:
        if service.settings.node_name and node != service.settings.node_name:
            raise NotOnThisNode(f"node {node} is not this agent's", node)
        return _object("NodeDevices", node, service.devices())

    return local_or_forward(get, request, caller, gateway)


@router.post(f"/{VERSION}/reassignments", status_code=201)
def create_reassignment(
    body: ReassignmentBody,
    request: Request,
    caller: Caller,
    authz: Authz,
    service: Service,
    gateway: Gate,
) -> Any:
    spec = body.spec
    authz.require(caller, "delete", spec.from_.namespace, spec.from_.pod)
    authz.require(caller, "create", spec.to.namespace, spec.to.pod)

    def reassign() -> dict[str, Any]:
        result = service.reassign(spec, caller.name)
        return _object(
            "Reassignment",
            f"{spec.from_.pod}-to-{spec.to.pod}",
            result,
            spec=spec.model_dump(by_alias=True, exclude_none=True),
        )

    answer = local_or_forward(
        reassign, request, caller, gateway, body.model_dump(by_alias=True, exclude_none=True)
    )
    return answer if isinstance(answer, Response) else JSONResponse(answer, status_code=201)
