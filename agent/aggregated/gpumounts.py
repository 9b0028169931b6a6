"""GPUMount (namespaced; name = the pod): lists (also across namespaces), and what the
table's GPUMount faces share (agent/operations/mounts.py: create, get, patch and delete):
the object, its body, the dry-run refusal, a PATCH's and a DELETE's bodies."""

from __future__ import annotations

import json
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from pydantic import BaseModel, ConfigDict, Field

from agent.aggregated.answers import Include, list_answer
from agent.aggregated.objects import GROUP_VERSION, PREFIX, VERSION, kube_object
from agent.auth.authorize import Authorizer
from agent.auth.identity import Identity
from agent.errors import BadRequest, Forbidden, UnsupportedMediaType
from agent.http.deps import Authz, Caller, Gate, Listing
from agent.node.desired import DesiredMount
from agent.routes.pods import Namespace
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


def gpumount(
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
    items = [gpumount(p, namespace) for p in listing.namespace_mounts(namespace)]
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
        items = [gpumount(p, ns) for ns, pods in sorted(mounts.items()) for p in pods]
        return list_answer(request, caller, gateway, "GPUMount", items, include)
    allowed = [ns for ns in listing.mounted_namespaces() if _may_list(authz, caller, ns)]
    items = [gpumount(p, ns) for ns in allowed for p in listing.namespace_mounts(ns)]
    answer = list_answer(request, caller, None, "GPUMount", items, include)
    answer.headers.append("Warning", f'299 - "{NODE_ONLY_WARNING}"')
    return answer
