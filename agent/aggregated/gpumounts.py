"""GPUMount (namespaced; name = the pod): create, get, list (also across namespaces),
patch (`kubectl apply`) and delete a pod's hot-mounted devices."""

from __future__ import annotations

import json
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from agent.aggregated.answers import Include, list_answer, one_answer
from agent.aggregated.objects import GROUP_VERSION, PREFIX, VERSION, kube_object
from agent.auth import Authorizer, Identity
from agent.deps import Authz, Caller, Gate, Listing, Mounting
from agent.errors import BadRequest, Forbidden, UnsupportedMediaType
from agent.node.desired import DesiredMount, merge_patch
from agent.routes.forwarding import local_or_forward
from agent.routes.pods import Namespace, PodName
from hotmount.wire.schemas import MountRequest, PodDevices

router = APIRouter(prefix=PREFIX, tags=["aggregated"])
NODE_ONLY_WARNING = (
    "this node's gpumounts only: you may not list gpumounts at the cluster scope; "
    "list a namespace (-n) to see every node's"
)


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
    obj = kube_object("GPUMount", devices.pod or "", devices, namespace, spec, created=created)
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
        return kube_object("GPUMount", pod, result, namespace, spec)

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
    return list_answer(request, caller, gateway, "GPUMount", items, include)


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
        return list_answer(request, caller, gateway, "GPUMount", items, include)
    allowed = [ns for ns in listing.mounted_namespaces() if _may_list(authz, caller, ns)]
    items = [_gpumount(p, ns) for ns in allowed for p in listing.namespace_mounts(ns)]
    answer = list_answer(request, caller, None, "GPUMount", items, include)
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
    return one_answer(request, "GPUMount", answer, include)


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
        return kube_object("GPUMount", pod, result, namespace)

    return local_or_forward(delete, request, caller, gateway)
