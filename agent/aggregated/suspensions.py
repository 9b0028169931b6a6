"""GPUMount's subresources `suspend` and `resume` (POST, a SuspendRequest or
ResumeRequest as the body): the API server authorizes `create` on `gpumounts/suspend` or
`gpumounts/resume` (a rule of their own in the shipped ClusterRoles), then the agent asks
`delete` (suspend) or `create` (resume) on the pod, as for /v1's routes; and for a
suspend that finds processes holding the GPUs, `force` too (it takes the GPUs from them,
as a forced unmount does).

GET on the same paths answers the progress of the one running (OperationProgress in
the object's status; agent/node/suspend_progress.py says why a polled GET): the API
server authorizes `get` on the subresource, and the agent asks the POST's own verb on
the pod, so that who may not suspend a pod may not watch its suspension either."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Body, Request

from agent.aggregated.objects import PREFIX, VERSION, kube_object
from agent.deps import Authz, Caller, Gate, Suspending
from agent.routes.forwarding import local_or_forward
from agent.routes.pods import PROGRESS_VERBS, ContainerQuery, Namespace, PodName
from hotmount.wire.schemas import ResumeRequest, SuspendRequest

router = APIRouter(prefix=PREFIX, tags=["aggregated"])
GPUMOUNT = f"/{VERSION}/namespaces/{{namespace}}/gpumounts/{{pod}}"


@router.post(f"{GPUMOUNT}/suspend")
def suspend_gpumount(
    namespace: Namespace,
    pod: PodName,
    body: Annotated[SuspendRequest, Body()],
    request: Request,
    caller: Caller,
    authz: Authz,
    suspending: Suspending,
    gateway: Gate,
) -> Any:
    authz.require(caller, "delete", namespace, pod)

    def suspend() -> dict[str, Any]:
        done = suspending.suspend_pod(
            namespace,
            pod,
            body.container,
            body.lock_timeout_seconds,
            caller.name,
            lambda target, holders: authz.require_taking_held(
                caller, target.namespace, target.name, holders, target.uid
            ),
        )
        return kube_object("GPUMount", pod, done, namespace)

    sent = body.model_dump(by_alias=True, exclude_none=True)
    return local_or_forward(suspend, request, caller, gateway, sent)


@router.post(f"{GPUMOUNT}/resume")
def resume_gpumount(
    namespace: Namespace,
    pod: PodName,
    body: Annotated[ResumeRequest, Body()],
    request: Request,
    caller: Caller,
    authz: Authz,
    suspending: Suspending,
    gateway: Gate,
) -> Any:
    authz.require(caller, "create", namespace, pod)

    def resume() -> dict[str, Any]:
        done = suspending.resume_pod(namespace, pod, body.container, body.mount, caller.name)
        return kube_object("GPUMount", pod, done, namespace)

    sent = body.model_dump(by_alias=True, exclude_none=True)
    return local_or_forward(resume, request, caller, gateway, sent)


def _progress_route(op: Literal["suspend", "resume"]) -> None:
    @router.get(f"{GPUMOUNT}/{op}", name=f"{op}_gpumount_progress")
    def progress(
        namespace: Namespace,
        pod: PodName,
        request: Request,
        caller: Caller,
        authz: Authz,
        suspending: Suspending,
        gateway: Gate,
        container: ContainerQuery = None,
    ) -> Any:
        authz.require(caller, PROGRESS_VERBS[op], namespace, pod)

        def look() -> dict[str, Any]:
            found = suspending.progress(namespace, pod, op, container)
            return kube_object("GPUMount", pod, found, namespace)

        return local_or_forward(look, request, caller, gateway)


_progress_route("suspend")
_progress_route("resume")
