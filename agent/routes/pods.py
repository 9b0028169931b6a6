"""/v1 with Kubernetes: a pod's devices, mount, unmount, suspend, resume and reassign."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Body, Path, Query, Request

from agent.deps import Authz, Caller, Gate, Listing, Mounting, Moves, Suspending
from agent.routes.forwarding import local_or_forward
from hotmount.wire.schemas import (
    MountRequest,
    MountResult,
    OperationProgress,
    PodDevices,
    ReassignRequest,
    ReassignResult,
    ResumeRequest,
    ResumeResult,
    SuspendRequest,
    SuspendResult,
    UnmountResult,
)

router = APIRouter(prefix="/v1", tags=["pods"])
# Every permission is checked before any work starts: a refusal changes nothing.

Namespace = Annotated[str, Path(pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", max_length=63)]
PodName = Annotated[str, Path(pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$", max_length=253)]
DevicePath = Annotated[str, Path(pattern=r"^[A-Za-z0-9][A-Za-z0-9_./:=-]*$", max_length=160)]
ContainerQuery = Annotated[
    str | None, Query(pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", max_length=63)
]


@router.get("/namespaces/{namespace}/pods/{pod}/devices")
def pod_devices(
    namespace: Namespace,
    pod: PodName,
    request: Request,
    caller: Caller,
    authz: Authz,
    listing: Listing,
    gateway: Gate,
) -> PodDevices | Any:
    authz.require(caller, "get", namespace, pod)
    return local_or_forward(
        lambda: listing.pod_devices_here(namespace, pod), request, caller, gateway
    )


@router.post("/namespaces/{namespace}/pods/{pod}/devices")
def mount(
    namespace: Namespace,
    pod: PodName,
    body: Annotated[MountRequest, Body()],
    request: Request,
    caller: Caller,
    authz: Authz,
    mounting: Mounting,
    gateway: Gate,
) -> MountResult | Any:
    authz.require_mount(
        caller,
        namespace,
        pod,
        body.share_with,
        body.force,
        netdev=body.netdev_request() is not None,
    )
    return local_or_forward(
        lambda: mounting.mount_pod(namespace, pod, body, caller.name),
        request,
        caller,
        gateway,
        body.model_dump(by_alias=True, exclude_none=True),
    )


@router.delete("/namespaces/{namespace}/pods/{pod}/devices/{device:path}")
def unmount(
    namespace: Namespace,
    pod: PodName,
    device: DevicePath,
    request: Request,
    caller: Caller,
    authz: Authz,
    mounting: Mounting,
    gateway: Gate,
    container: ContainerQuery = None,
    force: bool = False,
) -> UnmountResult | Any:
    authz.require(caller, "delete", namespace, pod)
    authz.require_force(caller, force, (namespace, pod))
    return local_or_forward(
        lambda: mounting.unmount_pod(
            namespace, pod, [device], container=container, force=force, user=caller.name
        ),
        request,
        caller,
        gateway,
    )


@router.post("/namespaces/{namespace}/pods/{pod}/suspend")
def suspend(
    namespace: Namespace,
    pod: PodName,
    body: Annotated[SuspendRequest, Body()],
    request: Request,
    caller: Caller,
    authz: Authz,
    suspending: Suspending,
    gateway: Gate,
) -> SuspendResult | Any:
    """Takes the pod's GPUs away as an unmount does: the verb is `delete`; and from the
    processes holding them, as a forced unmount does: then `force` too, asked once the
    suspend has found them (before anything changes)."""
    authz.require(caller, "delete", namespace, pod)
    return local_or_forward(
        lambda: suspending.suspend_pod(
            namespace,
            pod,
            body.container,
            body.lock_timeout_seconds,
            caller.name,
            lambda target, holders: authz.require_taking_held(
                caller, target.namespace, target.name, holders, target.uid
            ),
        ),
        request,
        caller,
        gateway,
        body.model_dump(by_alias=True, exclude_none=True),
    )


@router.post("/namespaces/{namespace}/pods/{pod}/resume")
def resume(
    namespace: Namespace,
    pod: PodName,
    body: Annotated[ResumeRequest, Body()],
    request: Request,
    caller: Caller,
    authz: Authz,
    suspending: Suspending,
    gateway: Gate,
) -> ResumeResult | Any:
    """Mounts a GPU into the pod as a mount does: the verb is `create`."""
    authz.require(caller, "create", namespace, pod)
    return local_or_forward(
        lambda: suspending.resume_pod(namespace, pod, body.container, body.mount, caller.name),
        request,
        caller,
        gateway,
        body.model_dump(by_alias=True, exclude_none=True),
    )


# A suspend's or a resume's progress is the POST's to see: the POST's own verb on the pod
# (`delete` to suspend, `create` to resume), so who may not suspend a pod may not watch it.
PROGRESS_VERBS = {"suspend": "delete", "resume": "create"}


def _progress_route(op: Literal["suspend", "resume"]) -> None:
    @router.get(f"/namespaces/{{namespace}}/pods/{{pod}}/{op}", name=f"{op}_progress")
    def progress(
        namespace: Namespace,
        pod: PodName,
        request: Request,
        caller: Caller,
        authz: Authz,
        suspending: Suspending,
        gateway: Gate,
        container: ContainerQuery = None,
    ) -> OperationProgress | Any:
        """The suspend or resume running on the pod, for a caller to poll while its POST
        runs."""
        authz.require(caller, PROGRESS_VERBS[op], namespace, pod)
        return local_or_forward(
            lambda: suspending.progress(namespace, pod, op, container), request, caller, gateway
        )


_progress_route("suspend")
_progress_route("resume")


@router.post("/reassign")
def reassign(
    body: ReassignRequest,
    request: Request,
    caller: Caller,
    authz: Authz,
    moves: Moves,
    gateway: Gate,
) -> ReassignResult | Any:
    source, target = (body.from_.namespace, body.from_.pod), (body.to.namespace, body.to.pod)
    authz.require(caller, "delete", *source)
    authz.require(caller, "create", *target)
    authz.require_force(caller, body.force, source, target)
    return local_or_forward(
        lambda: moves.reassign(body, caller.name),
        request,
        caller,
        gateway,
        body.model_dump(by_alias=True, exclude_none=True),
    )
