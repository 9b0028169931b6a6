"""The aggregated API `hotmount.io/v1alpha1`, served behind an APIService.

kubectl and nvcli reach it through the API server with the kubeconfig's own
credentials; the API server authenticates, then forwards the user in
`X-Remote-*` headers (verified in agent/auth.py). Authorization is ours: the same
SubjectAccessReviews as the /v1 API. Discovery documents are open to every
authenticated caller, as Kubernetes' own are.

    GPUMount (namespaced; name = the pod)  create, get, list (also across namespaces), delete
    NodeDevices (cluster; name = the node) get, list
    Reassignment (namespaced)               create

Lists and gets answer kubectl's Table requests (agent/tables.py), so `kubectl get` prints
useful columns; other clients get the objects.

The API server authorizes the aggregated path itself before it proxies, by the path's
scope. So a move between two pods of one namespace is a namespaced Reassignment, which a
RoleBinding to `hotmount-user` allows; a move across namespaces is the cluster-scoped
`POST .../reassignments`, which needs `create reassignments` at the cluster scope (a
ClusterRoleBinding). Either way the agent then checks `delete` on the source pod and
`create` on the target (and `force` on both when forced). Listing nodes' devices is
cluster-scoped (`nodedevices`): it shows holders in every namespace.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from agent.auth import Authorizer, Identity
from agent.deps import Authz, Caller, Gate, Listing, Mounting, Moves
from agent.errors import BadRequest, Forbidden, NotOnThisNode, UnsupportedMediaType
from agent.fanout import MissingNode, missing_warnings
from agent.gateway import LOCAL_ONLY, Gateway
from agent.node import listing as node_listing
from agent.node import moves as node_moves
from agent.node.desired import DesiredMount, merge_patch
from agent.routes.forwarding import local_or_forward
from agent.routes.pods import Namespace, PodName
from agent.schemas import KubeName, MountRequest, PodDevices, PodRef, ReassignRequest
from agent.tables import IncludeObject, table, table_version

GROUP, VERSION = "hotmount.io", "v1alpha1"
GROUP_VERSION = f"{GROUP}/{VERSION}"
PREFIX = f"/apis/{GROUP}"

router = APIRouter(prefix=PREFIX, tags=["aggregated"])
# A NodeDevices' creationTimestamp: when this agent started and took the node's inventory.
STARTED_AT = datetime.now(UTC).isoformat(timespec="seconds")
NODE_ONLY_WARNING = (
    "this node's gpumounts only: you may not list gpumounts at the cluster scope; "
    "list a namespace (-n) to see every node's"
)
# `?includeObject=`: what a Table row carries (kubectl asks for Metadata, the default).
Include = Annotated[IncludeObject, Query(alias="includeObject")]


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
    kind: str,
    name: str,
    status: BaseModel,
    namespace: str | None = None,
    spec: Any = None,
    created: str | None = None,
) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name}
    if namespace:
        metadata["namespace"] = namespace
    if created:
        metadata["creationTimestamp"] = created
    obj: dict[str, Any] = {"apiVersion": GROUP_VERSION, "kind": kind, "metadata": metadata}
    if spec is not None:
        obj["spec"] = spec
    obj["status"] = status.model_dump(mode="json", by_alias=True)
    return obj


def _may_list(authz: Authorizer, caller: Identity, namespace: str) -> bool:
    """Whether the caller may list gpumounts in `namespace` ("": every namespace)."""
    try:
        authz.require(caller, "list", namespace)
    except Forbidden:
        return False
    return True


def _gpumount(
    devices: PodDevices, namespace: str, desired: DesiredMount | None = None
) -> dict[str, Any]:
    """A pod's mounts as a GPUMount: its applied spec and annotations if it has them
    (kubectl apply diffs against those), created when applied or first mounted."""
    since = [d.mounted_at for c in devices.containers for d in c.devices if d.mounted_at]
    created = desired.created if desired else min(since, default=None)
    spec = desired.spec if desired else None
    obj = _object("GPUMount", devices.pod or "", devices, namespace, spec, created=created)
    if desired and desired.annotations:
        obj["metadata"]["annotations"] = desired.annotations
    return obj


async def merge_patch_body(request: Request) -> dict[str, Any]:
    """A PATCH's body, which must be a JSON merge patch: what client-side `kubectl apply`
    and `kubectl patch --type=merge` send (agents forwarding it send plain JSON)."""
    kind = request.headers.get("content-type", "").split(";")[0].strip()
    if kind == "application/apply-patch+yaml":
        raise UnsupportedMediaType(
            "server-side apply is not supported for gpumounts: use kubectl apply without "
            "--server-side (client-side apply sends a JSON merge patch)"
        )
    if kind not in ("application/merge-patch+json", "application/json"):
        raise UnsupportedMediaType(
            f"a GPUMount is patched with a JSON merge patch (application/merge-patch+json), "
            f"not {kind or 'no content type'}: kubectl patch --type=merge"
        )
    try:
        patch = json.loads(await request.body())
    except ValueError as exc:
        raise BadRequest(f"the patch is not JSON: {exc}") from exc
    if not isinstance(patch, dict):
        raise BadRequest("a JSON merge patch of a GPUMount is an object")
    return patch


def refuse_dry_run(dry_run: list[str] | None) -> None:
    """`--dry-run=server` would need every check of a mount without its effects, which
    the agent cannot promise: refused, clearly, before anything is done."""
    if dry_run:
        raise BadRequest(
            "dry run is not supported for gpumounts: the checks of a mount (claims, the "
            "kubelet's books, pins) cannot be made without making it; drop --dry-run=server"
        )


DryRun = Annotated[list[str] | None, Query(alias="dryRun", max_length=4)]


async def delete_options_dry_run(request: Request) -> list[str] | None:
    """kubectl sends a delete's options (`dryRun` among them) as a DeleteOptions body."""
    raw = await request.body()
    if not raw:
        return None
    try:
        options = json.loads(raw)
    except ValueError as exc:
        raise BadRequest(f"the DeleteOptions body is not JSON: {exc}") from exc
    dry_run = options.get("dryRun") if isinstance(options, dict) else None
    return [str(v) for v in dry_run] if isinstance(dry_run, list) else None


def _node_devices(
    listing: node_listing.Listing, node: str, fanned_out: bool = False
) -> dict[str, Any]:
    """`fanned_out`: another agent's ask for one part of a cluster's list, answered
    without reading the API server (the books of the last few seconds)."""
    devices = listing.devices(recent_books=fanned_out)
    return _object("NodeDevices", node, devices, created=STARTED_AT)


def _answer(
    request: Request,
    caller: Identity,
    gateway: Gateway | None,
    kind: str,
    local: list[dict[str, Any]],
    include: IncludeObject,
) -> Any:
    """This node's objects and every other node's, as a list, or its Table when kubectl
    asked for one. The nodes that did not answer are named in the list's metadata
    (`missingNodes`) and in Warning headers, which kubectl prints."""
    others = _other_nodes(request, caller, gateway)
    objects = local + others.items
    version = table_version(request.headers.get("accept"))
    answer = _list(kind, objects) if version is None else table(kind, objects, version, include)
    if others.missing:
        answer["metadata"]["missingNodes"] = [m.as_json() for m in others.missing]
    # Plain JSON already: FastAPI's own encoder would walk every value of 500 nodes' lists
    # again (a quarter of a second at 500 nodes of 8 GPUs).
    response = JSONResponse(answer)
    for warning in missing_warnings(others.missing):
        response.headers.append("Warning", warning)
    return response


def _answer_one(request: Request, kind: str, answer: Any, include: IncludeObject) -> Any:
    """One object (made here, or another node's agent's answer passed through), or its
    Table. Errors pass through as they came."""
    version = table_version(request.headers.get("accept"))
    if version is None:
        return answer
    if isinstance(answer, Response):
        if answer.status_code != 200:
            return answer
        answer = json.loads(bytes(answer.body))
    return table(kind, [answer], version, include)


@dataclass
class _Others:
    items: list[Any] = field(default_factory=list)
    missing: list[MissingNode] = field(default_factory=list)


def _other_nodes(request: Request, caller: Identity, gateway: Gateway | None) -> _Others:
    """The same list from every other agent, unless this request is one of those asks."""
    if gateway is None or request.headers.get(LOCAL_ONLY):
        return _Others()
    fanned = gateway.fan_out(caller, request.url.path)  # validated (agent/peer_answers.py)
    return _Others(items=fanned.items, missing=list(fanned.missing))


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
                "verbs": ["create", "delete", "get", "list", "patch"],
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
    dry_run: DryRun = None,
) -> Any:
    refuse_dry_run(dry_run)
    pod = body.metadata.name
    if body.metadata.namespace not in (None, namespace):
        raise BadRequest(f"metadata.namespace {body.metadata.namespace} is not {namespace}")
    authz.require_mount(
        caller,
        namespace,
        pod,
        body.spec.share_with,
        body.spec.force,
        netdev=body.spec.netdev_request() is not None,
    )
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
    include: Include = "Metadata",
) -> Any:
    authz.require(caller, "list", namespace)
    items = [_gpumount(p, namespace) for p in listing.namespace_mounts(namespace)]
    return _answer(request, caller, gateway, "GPUMount", items, include)


@router.get(f"/{VERSION}/gpumounts")
def list_gpumounts_everywhere(
    request: Request,
    caller: Caller,
    authz: Authz,
    listing: Listing,
    gateway: Gate,
    include: Include = "Metadata",
) -> Any:
    """`kubectl get gpumounts -A`: every namespace the caller may list, from every node.

    The API server lets this through only to callers who may list gpumounts at the
    cluster scope. Anyone else reaching the agent's port is authorized before any work:
    they see this node's namespaces (read from the ledger, no API call) where a
    SubjectAccessReview says they may list, and other nodes only through a namespace's
    list (`-n`), so a token with no rights costs no pod reads and asks no other agent.
    """
    if _may_list(authz, caller, ""):
        mounts = listing.all_mounts()
        items = [_gpumount(p, ns) for ns, pods in sorted(mounts.items()) for p in pods]
        return _answer(request, caller, gateway, "GPUMount", items, include)
    allowed = [ns for ns in listing.mounted_namespaces() if _may_list(authz, caller, ns)]
    items = [_gpumount(p, ns) for ns in allowed for p in listing.namespace_mounts(ns)]
    answer = _answer(request, caller, None, "GPUMount", items, include)
    answer.headers.append("Warning", f'299 - "{NODE_ONLY_WARNING}"')
    return answer


@router.get(f"/{VERSION}/namespaces/{{namespace}}/gpumounts/{{pod}}")
def get_gpumount(
    namespace: Namespace,
    pod: PodName,
    request: Request,
    caller: Caller,
    authz: Authz,
    listing: Listing,
    gateway: Gate,
    mounting: Mounting,
    include: Include = "Metadata",
) -> Any:
    authz.require(caller, "get", namespace, pod)

    def get() -> dict[str, Any]:
        found = listing.pod_devices_here(namespace, pod)
        desired = mounting.desired.get(namespace, pod, found.pod_uid)
        return _gpumount(found.model_copy(update={"pod": pod}), namespace, desired)

    answer = local_or_forward(get, request, caller, gateway)
    return _answer_one(request, "GPUMount", answer, include)


@router.patch(f"/{VERSION}/namespaces/{{namespace}}/gpumounts/{{pod}}")
def patch_gpumount(
    namespace: Namespace,
    pod: PodName,
    request: Request,
    caller: Caller,
    authz: Authz,
    listing: Listing,
    mounting: Mounting,
    gateway: Gate,
    patch: Annotated[dict[str, Any], Depends(merge_patch_body)],
    dry_run: DryRun = None,
) -> Any:
    """`kubectl apply`: the GPUMount's spec is what the pod should have. The patch is
    merged into the applied spec and annotations (on the pod's own node, where they are
    kept), then the difference is mounted and unmounted (docs/api.md, "Desired state")."""
    refuse_dry_run(dry_run)
    # Before the pod is looked up or the request forwarded: a refusal is the same 403
    # whether the pod exists or not. Every edit needs both (it may add or take away);
    # sharing, force and network interfaces are checked once the merged spec says so.
    authz.require(caller, "create", namespace, pod)
    authz.require(caller, "delete", namespace, pod)

    def apply() -> dict[str, Any]:
        uid = listing.pod_devices_here(namespace, pod).pod_uid  # here, or NotOnThisNode
        current = mounting.desired.get(namespace, pod, uid)
        was = {
            "metadata": {"annotations": current.annotations if current else {}},
            "spec": current.spec if current else {},
        }
        merged = merge_patch(was, patch)
        metadata, spec = merged.get("metadata") or {}, merged.get("spec") or {}
        if metadata.get("name", pod) != pod or metadata.get("namespace", namespace) != namespace:
            raise BadRequest("a GPUMount's name and namespace are its pod's: they do not change")
        try:
            wanted = MountRequest.model_validate(spec)
        except ValidationError as exc:  # 422 Invalid, each cause under `spec`
            errors = [{**e, "loc": ("spec", *e["loc"])} for e in exc.errors()]
            raise RequestValidationError(errors) from exc
        authz.require_mount(
            caller,
            namespace,
            pod,
            wanted.share_with,
            wanted.force,
            netdev=wanted.netdev_request() is not None,
        )
        authz.require(caller, "delete", namespace, pod)  # an edit may take devices away
        annotations = {str(k): str(v) for k, v in (metadata.get("annotations") or {}).items()}
        desired = mounting.apply_pod(namespace, pod, spec, annotations, caller.name)
        found = listing.pod_devices_here(namespace, pod)
        return _gpumount(found.model_copy(update={"pod": pod}), namespace, desired)

    return local_or_forward(apply, request, caller, gateway, patch)


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
    dry_run: DryRun = None,
    options_dry_run: Annotated[list[str] | None, Depends(delete_options_dry_run)] = None,
) -> Any:
    refuse_dry_run((dry_run or []) + (options_dry_run or []))
    authz.require(caller, "delete", namespace, pod)
    authz.require_force(caller, force, (namespace, pod))

    def delete() -> dict[str, Any]:
        result = mounting.unmount_pod(
            namespace, pod, device or None, container=container, force=force, user=caller.name
        )
        if not device:  # `kubectl delete gpumount POD`: the applied spec goes too
            mounting.desired.delete(namespace, pod)
        return _object("GPUMount", pod, result, namespace)

    return local_or_forward(delete, request, caller, gateway)


@router.get(f"/{VERSION}/nodedevices")
def list_node_devices(
    request: Request,
    caller: Caller,
    authz: Authz,
    listing: Listing,
    gateway: Gate,
    include: Include = "Metadata",
) -> Any:
    authz.require(caller, "list", resource="nodedevices")
    fanned_out = bool(request.headers.get(LOCAL_ONLY))
    items = [_node_devices(listing, listing.node_name or "", fanned_out)]
    return _answer(request, caller, gateway, "NodeDevices", items, include)


@router.get(f"/{VERSION}/nodedevices/{{node}}")
def get_node_devices(
    node: PodName,
    request: Request,
    caller: Caller,
    authz: Authz,
    listing: Listing,
    gateway: Gate,
    include: Include = "Metadata",
) -> Any:
    authz.require(caller, "get", name=node, resource="nodedevices")

    def get() -> dict[str, Any]:
        if listing.node_name and node != listing.node_name:
            raise NotOnThisNode(f"node {node} is not this agent's", node)
        return _node_devices(listing, node)

    answer = local_or_forward(get, request, caller, gateway)
    return _answer_one(request, "NodeDevices", answer, include)


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
