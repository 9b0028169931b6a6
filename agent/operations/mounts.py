"""A pod's mounts: read, mount, unmount, and (aggregated only) apply a desired spec.

/v1 (the pod in the path)                  hotmount.io GPUMount (name = the pod)
GET    .../pods/{pod}/devices              GET    .../gpumounts/{pod}  (or its Table)
POST   .../pods/{pod}/devices              POST   .../gpumounts        (201; the pod is
                                                                        metadata.name)
DELETE .../pods/{pod}/devices/{device}     DELETE .../gpumounts/{pod}?device=...  (none:
                                            every device, and the applied spec goes too)
                                           PATCH  .../gpumounts/{pod}  (kubectl apply)
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Depends, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import ValidationError

from agent.aggregated.answers import Include, one_answer
from agent.aggregated.gpumounts import (
    DryRun,
    GPUMountBody,
    delete_options_dry_run,
    gpumount,
    merge_patch_body,
    refuse_dry_run,
)
from agent.aggregated.objects import VERSION, kube_object
from agent.auth.authorize import Authorizer
from agent.auth.identity import Identity
from agent.errors import BadRequest
from agent.node.desired import merge_patch
from agent.operations.placement import Ask, Call
from agent.operations.table import Args, Face, Operation, body, dependency, path, query
from agent.routes.pods import ContainerQuery, DevicePath, Namespace, PodName
from hotmount.wire.schemas import MountRequest, MountResult, PodDevices, UnmountResult

V1_DEVICES = "/namespaces/{namespace}/pods/{pod}/devices"
GPUMOUNTS = f"/{VERSION}/namespaces/{{namespace}}/gpumounts"
GPUMOUNT = f"{GPUMOUNTS}/{{pod}}"
NAMESPACE, POD = path("namespace", Namespace), path("pod", PodName)


def _pod(args: Args) -> Ask:
    return Ask(args["namespace"], args["pod"], options=args)


def _sent(args: Args, ask: Ask) -> Any:
    return args["body"].model_dump(by_alias=True, exclude_none=True)


def _created(request: Request, ask: Ask, answer: Any) -> Any:
    return answer if isinstance(answer, Response) else JSONResponse(answer, status_code=201)


def _one(request: Request, ask: Ask, answer: Any) -> Any:
    return one_answer(request, "GPUMount", answer, ask.options["include"])


def _devices(call: Call) -> PodDevices:
    ask = call.ask
    return call.node.listing.pod_devices_here(ask.namespace, ask.pod, call.found is not None)


def _as_gpumount(call: Call, found: PodDevices) -> dict[str, Any]:
    ask = call.ask
    desired = call.node.mounting.desired.get(ask.namespace, ask.pod, found.pod_uid)
    return gpumount(found.model_copy(update={"pod": ask.pod}), ask.namespace, desired)


GET = Operation(
    name="get",
    method="GET",
    verb="get",
    request=None,
    result=PodDevices,
    run=_devices,
    kind="GPUMount",
    v1=Face(V1_DEVICES, "pod_devices", (NAMESPACE, POD), _pod),
    aggregated=[
        Face(
            GPUMOUNT,
            "get_gpumount",
            (NAMESPACE, POD, query("include", Include, "Metadata")),
            _pod,
            answer=_as_gpumount,
            deliver=_one,
        )
    ],
)


def _mount_ask(args: Args) -> Ask:
    return Ask(args["namespace"], args["pod"], args["body"])


def _create_ask(args: Args) -> Ask:
    """`kubectl create -f`: the pod is the GPUMount's name; a dry run is refused first."""
    refuse_dry_run(args["dry_run"])
    made: GPUMountBody = args["body"]
    namespace = args["namespace"]
    if made.metadata.namespace not in (None, namespace):
        raise BadRequest(f"metadata.namespace {made.metadata.namespace} is not {namespace}")
    return Ask(namespace, made.metadata.name, made.spec)


def _may_mount(authz: Authorizer, caller: Identity, ask: Ask) -> None:
    wanted: MountRequest = ask.request
    netdev = wanted.netdev_request() is not None
    authz.require_mount(
        caller, ask.namespace, ask.pod, wanted.share_with, wanted.force, netdev=netdev
    )


def _mount(call: Call) -> Any:
    ask = call.ask
    return call.node.mounting.mount_pod(
        ask.namespace, ask.pod, ask.request, call.caller.name, call.found
    )


def _mounted_gpumount(call: Call, result: Any) -> dict[str, Any]:
    ask = call.ask
    spec = ask.request.model_dump(by_alias=True, exclude_none=True)
    return kube_object("GPUMount", ask.pod, result, ask.namespace, spec)


MOUNT = Operation(
    name="mount",
    method="POST",
    verb="create",
    request=MountRequest,
    result=MountResult,
    run=_mount,
    kind="GPUMount",
    metric="mount",
    authorize=_may_mount,
    v1=Face(V1_DEVICES, "mount", (NAMESPACE, POD, body(MountRequest)), _mount_ask, _sent),
    aggregated=[
        Face(
            GPUMOUNTS,
            "create_gpumount",
            (NAMESPACE, body(GPUMountBody), query("dry_run", DryRun)),
            _create_ask,
            _sent,
            _mounted_gpumount,
            _created,
            status_code=201,
        )
    ],
)


def _unmount_ask(args: Args) -> Ask:
    options = {"devices": [args["device"]], "container": args["container"], "force": args["force"]}
    return Ask(args["namespace"], args["pod"], options=options)


def _delete_ask(args: Args) -> Ask:
    """`kubectl delete gpumount POD` (every device), or `?device=` for some."""
    refuse_dry_run((args["dry_run"] or []) + (args["options_dry_run"] or []))
    devices = args["device"] or None
    options = {"devices": devices, "container": args["container"], "force": args["force"]}
    return Ask(args["namespace"], args["pod"], options=options)


def _may_unmount(authz: Authorizer, caller: Identity, ask: Ask) -> None:
    authz.require(caller, "delete", ask.namespace, ask.pod)
    authz.require_force(caller, ask.options["force"], (ask.namespace, ask.pod))


def _unmount(call: Call) -> UnmountResult:
    ask, mounting, options = call.ask, call.node.mounting, call.ask.options
    result = mounting.unmount_pod(
        ask.namespace,
        ask.pod,
        options["devices"],
        container=options["container"],
        force=options["force"],
        user=call.caller.name,
        found=call.found,
    )
    if options["devices"] is None:  # the whole GPUMount: the applied spec goes too
        mounting.desired.delete(ask.namespace, ask.pod)
    return result


def _status(call: Call, result: Any) -> dict[str, Any]:
    return kube_object("GPUMount", call.ask.pod, result, call.ask.namespace)


POD_CONTAINER = Annotated[str | None, Query(pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")]
UNMOUNT = Operation(
    name="unmount",
    method="DELETE",
    verb="delete",
    request=None,
    result=UnmountResult,
    run=_unmount,
    kind="GPUMount",
    metric="unmount",
    authorize=_may_unmount,
    v1=Face(
        f"{V1_DEVICES}/{{device:path}}",
        "unmount",
        (
            NAMESPACE,
            POD,
            path("device", DevicePath),
            query("container", ContainerQuery),
            query("force", bool, False),
        ),
        _unmount_ask,
    ),
    aggregated=[
        Face(
            GPUMOUNT,
            "delete_gpumount",
            (
                NAMESPACE,
                POD,
                query("device", Annotated[list[str] | None, Query(max_length=64)]),
                query("container", POD_CONTAINER),
                query("force", bool, False),
                query("dry_run", DryRun),
                query(
                    "options_dry_run",
                    Annotated[list[str] | None, Depends(delete_options_dry_run)],
                ),
            ),
            _delete_ask,
            answer=_status,
        )
    ],
)


def _patch_ask(args: Args) -> Ask:
    refuse_dry_run(args["dry_run"])
    return Ask(args["namespace"], args["pod"], args["patch"])


def _may_edit(authz: Authorizer, caller: Identity, ask: Ask) -> None:
    """Before the pod is looked up or the request forwarded: a refusal is the same 403
    whether the pod exists or not. Every edit needs both (it may add or take away);
    sharing, force and network interfaces are checked once the merged spec says so."""
    authz.require(caller, "create", ask.namespace, ask.pod)
    authz.require(caller, "delete", ask.namespace, ask.pod)


def _apply(call: Call) -> dict[str, Any]:
    """`kubectl apply`: the GPUMount's spec is what the pod should have. The patch is
    merged into the applied spec and annotations (on the pod's own node, where they are
    kept), then the difference is mounted and unmounted (docs/api.md, "Desired state")."""
    namespace, pod, patch = call.ask.namespace, call.ask.pod, call.ask.request
    listing, mounting = call.node.listing, call.node.mounting
    uid = listing.pod_devices_here(namespace, pod, call.found is not None).pod_uid
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
    _may_mount(call.authz, call.caller, Ask(namespace, pod, wanted))
    call.authz.require(call.caller, "delete", namespace, pod)  # an edit may take devices away
    annotations = {str(k): str(v) for k, v in (metadata.get("annotations") or {}).items()}
    desired = mounting.apply_pod(namespace, pod, spec, annotations, call.caller.name, call.found)
    found = listing.pod_devices_here(namespace, pod, located=True)
    return gpumount(found.model_copy(update={"pod": pod}), namespace, desired)


APPLY = Operation(
    name="apply",
    method="PATCH",
    verb="create",
    request=dict,
    result=dict,
    run=_apply,
    kind="GPUMount",
    authorize=_may_edit,
    aggregated=[
        Face(
            GPUMOUNT,
            "patch_gpumount",
            (
                NAMESPACE,
                POD,
                dependency("patch", Annotated[dict[str, Any], Depends(merge_patch_body)]),
                query("dry_run", DryRun),
            ),
            _patch_ask,
            lambda args, ask: args["patch"],
            doc=_apply.__doc__,
        )
    ],
)
