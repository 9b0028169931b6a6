"""Suspend and resume a pod's GPUs, and watch either run.

/v1 `POST .../pods/{pod}/suspend|resume`; the aggregated API's GPUMount subresources
`suspend` and `resume` (a SuspendRequest or ResumeRequest as the body): the API server
authorizes `create` on `gpumounts/suspend` or `gpumounts/resume` (a rule of their own in
the shipped ClusterRoles), then the agent asks `delete` (suspend) or `create` (resume) on
the pod; and for a suspend that finds processes holding the GPUs, `force` too (it takes
the GPUs from them, as a forced unmount does).

GET on the same paths answers the progress of the one running (OperationProgress; in the
aggregated face, in the object's status; agent/suspend/progress.py says why a
polled GET). The API server authorizes `get` on the subresource, and the agent asks the
POST's own verb on the pod, so that who may not suspend a pod may not watch its
suspension either. A suspend or resume running here is answered with no look at the pod.
"""

from __future__ import annotations

from typing import Any, Literal

from agent.aggregated.objects import VERSION, kube_object
from agent.auth.authorize import Authorizer
from agent.auth.identity import Identity
from agent.node import Node
from agent.operations.placement import Ask, Call
from agent.operations.table import Args, Face, Operation, body, path, query
from agent.routes.pods import PROGRESS_VERBS, ContainerQuery, Namespace, PodName
from hotmount.wire.schemas import (
    OperationProgress,
    ResumeRequest,
    ResumeResult,
    SuspendRequest,
    SuspendResult,
)

V1_POD = "/namespaces/{namespace}/pods/{pod}"
GPUMOUNT = f"/{VERSION}/namespaces/{{namespace}}/gpumounts/{{pod}}"
NAMESPACE, POD = path("namespace", Namespace), path("pod", PodName)


def ask_of(args: Args) -> Ask:
    return Ask(args["namespace"], args["pod"], args.get("body"), options=args)


def sent_body(args: Args, ask: Ask) -> Any:
    return args["body"].model_dump(by_alias=True, exclude_none=True)


def as_gpumount(call: Call, result: Any) -> dict[str, Any]:
    return kube_object("GPUMount", call.ask.pod, result, call.ask.namespace)


def _suspend(call: Call) -> SuspendResult:
    ask, caller, authz = call.ask, call.caller, call.authz
    wanted: SuspendRequest = ask.request
    return call.node.suspending.suspend_pod(
        ask.namespace,
        ask.pod,
        wanted.container,
        wanted.lock_timeout_seconds,
        caller.name,
        lambda target, holders: authz.require_taking_held(
            caller, target.namespace, target.name, holders, target.uid
        ),
        call.found,
    )


def _resume(call: Call) -> ResumeResult:
    ask = call.ask
    wanted: ResumeRequest = ask.request
    return call.node.suspending.resume_pod(
        ask.namespace, ask.pod, wanted.container, wanted.mount, call.caller.name, call.found
    )


POSTED_DOCS = {
    "suspend": "Takes the pod's GPUs away as an unmount does: the verb is `delete`; and from "
    "the\nprocesses holding them, as a forced unmount does: then `force` too, asked once the"
    "\nsuspend has found them (before anything changes).",
    "resume": "Mounts a GPU into the pod as a mount does: the verb is `create`.",
}
PROGRESS_DOC = (
    "The suspend or resume running on the pod, for a caller to poll while its POST\nruns."
)


def _posted(op: str, model: Any, result: Any, verb: str, run: Any) -> Operation:
    """A suspend or a resume: the verb the pod needs is the one its effect needs (a
    suspend takes GPUs away as an unmount does: `delete`; a resume mounts: `create`)."""
    params = (NAMESPACE, POD, body(model))
    return Operation(
        name=op,
        method="POST",
        verb=verb,
        request=model,
        result=result,
        run=run,
        kind="GPUMount",
        metric=op,
        v1=Face(f"{V1_POD}/{op}", op, params, ask_of, sent_body, doc=POSTED_DOCS[op]),
        aggregated=[
            Face(f"{GPUMOUNT}/{op}", f"{op}_gpumount", params, ask_of, sent_body, as_gpumount)
        ],
    )


def _progress(op: Literal["suspend", "resume"]) -> Operation:
    def run(call: Call) -> OperationProgress:
        ask = call.ask
        container = ask.options["container"]
        located = call.found is not None
        return call.node.suspending.progress(ask.namespace, ask.pod, op, container, located)

    def running(node: Node, ask: Ask) -> bool:
        return node.suspending.running(ask.namespace, ask.pod, op, ask.options["container"])

    def may_watch(authz: Authorizer, caller: Identity, ask: Ask) -> None:
        authz.require(caller, PROGRESS_VERBS[op], ask.namespace, ask.pod)

    params = (NAMESPACE, POD, query("container", ContainerQuery))
    return Operation(
        name=f"{op}_progress",
        method="GET",
        verb=PROGRESS_VERBS[op],
        request=None,
        result=OperationProgress,
        run=run,
        kind="GPUMount",
        authorize=may_watch,
        answered_here=running,
        v1=Face(f"{V1_POD}/{op}", f"{op}_progress", params, ask_of, doc=PROGRESS_DOC),
        aggregated=[
            Face(f"{GPUMOUNT}/{op}", f"{op}_gpumount_progress", params, ask_of, answer=as_gpumount)
        ],
    )


SUSPEND = _posted("suspend", SuspendRequest, SuspendResult, "delete", _suspend)
RESUME = _posted("resume", ResumeRequest, ResumeResult, "create", _resume)
SUSPEND_PROGRESS, RESUME_PROGRESS = _progress("suspend"), _progress("resume")
