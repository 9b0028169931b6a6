"""The importable Python client for the gpu-hotmount agent; nvcli is built on it.

    from cli.client import HotmountClient

    # Through the API server, with the kubeconfig's own credentials (aggregated API):
    with HotmountClient.from_kubeconfig(context="prod") as hm:
        result = hm.mount("ml", "notebook-0", devices=["0"])
        print([d.key for d in result.mounted])
        hm.unmount("ml", "notebook-0", devices=["0"], force=True)

    # Straight to an agent (in-cluster platforms), with a ServiceAccount token:
    sa = "/var/run/secrets/kubernetes.io/serviceaccount"
    with HotmountClient.for_agent("https://gpu-hotmount.gpu-hotmount.svc:8443",
                                  token=open(f"{sa}/token").read().strip(),
                                  verify=f"{sa}/ca.crt") as hm:
        hm.mount("ml", "notebook-0", count=1)

Results are the wire's models (`hotmount.wire.schemas`): `MountResult`, `UnmountResult`,
`PodDevices`, `DeviceList`, `ReassignResult`, `SuspendResult`, `ResumeResult`,
`OperationProgress`. Every failure raises one exception tree (hotmount/wire/errors.py):

    HotmountClientError                exit 1   .status (the agent's `Status`), .reason, .code
    ├── InvalidRequest                 exit 2   400/422: bad device, container, body
    ├── Conflict                       exit 3   409: claimed, allocated, pod not running, ...
    │   └── Busy                       exit 3   DeviceBusy: a process holds the device open
    ├── NotFound                       exit 4   404: pod, container, device, node
    ├── Unauthorized                   exit 5   401
    ├── Forbidden                      exit 5   403
    ├── Timeout                        exit 6   504 from the agent, or the HTTP call timed out
    └── Unavailable                    exit 1   503, connection refused, TLS failure

Two transports, one interface (cli/transport/transports.py): `AgentTransport` speaks the agent's
`/v1` REST paths; `AggregatedTransport` speaks `hotmount.io/v1alpha1` through the API
server (see docs/api.md). The `*_container` methods exist only on a standalone agent
(`hotmount-agent --no-kubernetes`).
"""

from __future__ import annotations

import ssl
from typing import TYPE_CHECKING, Any

from cli.transport.connect import http_client
from cli.transport.transports import (
    AGGREGATED_PREFIX,
    API_GROUP,
    API_VERSION,
    AgentTransport,
    AggregatedTransport,
    Op,
    Transport,
    dump,
    merge_unmounts,
    schemas,
    status_from_response,
)
from hotmount.wire.errors import (
    DEFAULT_REASON,
    DEFAULT_TIMEOUT,
    EXIT_AUTH,
    EXIT_CONFLICT,
    EXIT_ERROR,
    EXIT_NOT_FOUND,
    EXIT_OK,
    EXIT_QUOTA,
    EXIT_TIMEOUT,
    EXIT_USAGE,
    Busy,
    Conflict,
    Forbidden,
    HotmountClientError,
    InvalidRequest,
    NotFound,
    QuotaExceeded,
    Timeout,
    Unauthorized,
    Unavailable,
    error_for,
    make_status,
)

if TYPE_CHECKING:  # at run time imported on first use: `nvcli status` needs no pydantic
    from pydantic import ValidationError

    from hotmount.wire.ondemand import AcquireResult, ReleaseResult
    from hotmount.wire.schemas import (
        DeviceList,
        MountRequest,
        MountResult,
        OperationProgress,
        PodDevices,
        PodRef,
        ReassignResult,
        ResumeResult,
        SuspendResult,
        UnmountResult,
    )

__all__ = [
    "AGGREGATED_PREFIX",
    "API_GROUP",
    "API_VERSION",
    "DEFAULT_REASON",
    "DEFAULT_TIMEOUT",
    "EXIT_AUTH",
    "EXIT_CONFLICT",
    "EXIT_ERROR",
    "EXIT_NOT_FOUND",
    "EXIT_OK",
    "EXIT_QUOTA",
    "EXIT_TIMEOUT",
    "EXIT_USAGE",
    "AgentTransport",
    "AggregatedTransport",
    "Busy",
    "Conflict",
    "Forbidden",
    "HotmountClient",
    "HotmountClientError",
    "InvalidRequest",
    "NotFound",
    "QuotaExceeded",
    "Timeout",
    "Transport",
    "Unauthorized",
    "Unavailable",
    "error_for",
    "http_client",
    "make_status",
    "merge_unmounts",
    "status_from_response",
]


# -- the client -----------------------------------------------------------------------------


class HotmountClient:
    """Mount, unmount, list and move GPUs through one transport. Use it as a context manager.

    Device references are NVML indices (`"0"`), UUIDs (`"GPU-..."`) or CDI names
    (`"nvidia.com/gpu=0"`). Errors raise `HotmountClientError` subclasses.
    """

    def __init__(self, transport: Transport) -> None:
        self.transport = transport

    @classmethod
    def for_agent(
        cls,
        url: str,
        token: str | None = None,
        *,
        verify: ssl.SSLContext | bool | str = True,
        timeout: float | None = DEFAULT_TIMEOUT,
    ) -> HotmountClient:
        """Call an agent directly (its `/v1` paths) with a bearer token.

        A token is never sent in clear text over a network: `http://` is refused (ValueError)
        unless the host is loopback, as nvcli refuses it."""
        if token:
            from cli.transport.cleartext import refuse_plain_credentials

            refuse_plain_credentials(url, "the bearer token")
        header = f"Bearer {token}" if token else None
        http = http_client(url, verify=verify, authorization=lambda: header, timeout=timeout)
        return cls(AgentTransport(http, f"the agent at {url}"))

    @classmethod
    def from_kubeconfig(
        cls,
        kubeconfig: str | None = None,
        context: str | None = None,
        *,
        timeout: float | None = DEFAULT_TIMEOUT,
    ) -> HotmountClient:
        """Call the aggregated API through the API server the kubeconfig names."""
        from cli.transport.kubeconfig import aggregated_http_client, load

        kube = load(kubeconfig, context)
        http = aggregated_http_client(kube, timeout=timeout)
        return cls(AggregatedTransport(http, f"the API server at {kube.server}"))

    # -- lifecycle
    def close(self) -> None:
        self.transport.http.close()

    def __enter__(self) -> HotmountClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- operations
    def mount(
        self,
        namespace: str,
        pod: str,
        devices: list[str] | None = None,
        count: int | None = None,
        container: str | list[str] | None = None,
        force: bool = False,
        share_with: str | None = None,
        **riders: Any,
    ) -> MountResult:
        """Hot-mount `devices` (or, with `count`, N scheduler-accounted GPUs) into a pod.

        `container`: one name, several (the same devices into each), or `["*"]` for all
        of the pod's; `share_with`: a pod of the same namespace whose GPU this joins.
        `riders`: what comes with the GPUs, as MountRequest names it: `with_rdma=True`,
        `rdma=["rdma/mlx5_0"]`, `with_netdev=True`, `netdev={"name": ..., "mtu": ...}`."""
        request = _mount_request(devices, count, container, force, share_with, **riders)
        return self.transport.mount(namespace, pod, request)

    def unmount(
        self,
        namespace: str,
        pod: str,
        devices: list[str] | None = None,
        container: str | None = None,
        force: bool = False,
    ) -> UnmountResult:
        """Take devices away (all hot-mounted ones when `devices` is None).

        `force` stops the container's processes that hold a device open.
        """
        return self.transport.unmount(namespace, pod, devices, container, force)

    def status(self, namespace: str, pod: str) -> PodDevices:
        """What is hot-mounted in each container of a pod."""
        return self.transport.status(namespace, pod)

    def status_document(self, namespace: str, pod: str) -> dict[str, Any]:
        """`status` as the JSON document the agent sent (camelCase), no model built."""
        return self.transport.status_document(namespace, pod)

    def list_devices(self, node: str | None = None) -> list[DeviceList]:
        """The devices of a node (every node when `node` is None) and who holds each."""
        return self.transport.list_devices(node)

    def list_every_node(self) -> list[DeviceList]:
        """Every node's devices, also through an agent called directly: it serves the
        aggregated API's list too, and asks the other agents for the caller (as the API
        server's call would); nodes that did not answer come last, named."""
        if isinstance(self.transport, AgentTransport):
            return self.transport.every_node()
        return self.transport.list_devices(None)

    def pod_names(self, namespace: str) -> list[str]:
        """The namespace's pods, from the API server (shell completion of `--name`); none
        through an agent called directly, which lists no pods."""
        if isinstance(self.transport, AggregatedTransport):
            return self.transport.pod_names(namespace)
        return []

    def move(
        self,
        device: str,
        from_ref: PodRef | tuple[str, ...],
        to_ref: PodRef | tuple[str, ...],
        force: bool = False,
    ) -> ReassignResult:
        """Unmount `device` from one pod and mount it into another.

        Refs are `PodRef`s or tuples `(namespace, pod[, container])`.
        """
        from pydantic import ValidationError

        try:
            request = schemas().ReassignRequest.model_validate(
                {
                    "device": device,
                    "from": _pod_ref(from_ref),
                    "to": _pod_ref(to_ref),
                    "force": force,
                }
            )
        except ValidationError as exc:
            raise InvalidRequest(make_status(400, _problems(exc), "BadRequest")) from exc
        return self.transport.move(request)

    def suspend(
        self,
        namespace: str,
        pod: str,
        container: str | None = None,
        lock_timeout: float | None = None,
    ) -> SuspendResult:
        """Take a pod's hot-mounted GPUs away, its CUDA processes kept and their GPU memory
        moved into host memory (docs/api.md, "Suspend and resume").

        `container`: whose GPUs (default: the pod's only one); `lock_timeout`: seconds
        each CUDA process may take to lock (at most the agent's cap, 30; None: the
        agent's default). Only what is given is sent."""
        given = {"container": container, "lock_timeout_seconds": lock_timeout}
        request = _request("SuspendRequest", given)
        return self.transport.suspend(namespace, pod, request)

    def resume(
        self,
        namespace: str,
        pod: str,
        container: str | None = None,
        mount: list[str] | None = None,
    ) -> ResumeResult:
        """Give a suspended pod a GPU back and restore its processes onto it.

        `mount`: the GPUs to resume onto, one per suspended GPU (default: the same GPU
        if free, else one of the same model)."""
        request = _request("ResumeRequest", {"container": container, "mount": mount})
        return self.transport.resume(namespace, pod, request)

    def progress(
        self, namespace: str, pod: str, op: Op, container: str | None = None
    ) -> OperationProgress:
        """The suspend or resume (`op`) running on the pod, for a caller to poll while
        its own call runs; `running` is false when none does."""
        return self.transport.progress(namespace, pod, op, container)

    def acquire(
        self, namespace: str, pod: str, container: str | None = None, wait: float | None = None
    ) -> AcquireResult:
        """An on-demand pod's GPU (docs/notebooks.md): attached within `wait` seconds (at
        most the agent's cap, 20; None: the agent's default), or its place in the node's
        queue (`state: waiting`). Asking again keeps the pod's place."""
        from hotmount.wire.ondemand import AcquireRequest

        request = _made(AcquireRequest, {"container": container, "wait_seconds": wait})
        result: AcquireResult = self.transport.on_demand(namespace, pod, "acquire", request)
        return result

    def release(
        self, namespace: str, pod: str, container: str | None = None, leave: bool = False
    ) -> ReleaseResult:
        """The pod's cell ended (its GPU suspended after its idle time); `leave`: stop
        waiting for one, the place given up."""
        from hotmount.wire.ondemand import ReleaseRequest

        request = _made(ReleaseRequest, {"container": container, "leave": leave or None})
        result: ReleaseResult = self.transport.on_demand(namespace, pod, "release", request)
        return result

    # -- standalone agents
    def _standalone(self) -> AgentTransport:
        if not isinstance(self.transport, AgentTransport):
            raise InvalidRequest(
                make_status(
                    400,
                    "containers by ID are served only by a standalone agent (--agent URL)",
                    "BadRequest",
                )
            )
        return self.transport

    def mount_container(
        self, container_id: str, devices: list[str] | None = None, force: bool = False
    ) -> MountResult:
        request = _mount_request(devices, None, None, force)
        return self._standalone().mount_container(container_id, request)

    def unmount_container(
        self, container_id: str, devices: list[str] | None = None, force: bool = False
    ) -> UnmountResult:
        return self._standalone().unmount_container(container_id, devices, force)

    def container_status(self, container_id: str) -> PodDevices:
        return self._standalone().container_status(container_id)

    def container_status_document(self, container_id: str) -> dict[str, Any]:
        return self._standalone().container_status_document(container_id)


def _mount_request(
    devices: list[str] | None,
    count: int | None,
    container: str | list[str] | None,
    force: bool,
    share_with: str | None = None,
    **riders: Any,
) -> MountRequest:
    one = container if isinstance(container, str) or container is None else None
    if isinstance(container, list) and len(container) == 1 and container[0] != "*":
        one = container[0]  # the old single-container request: any agent reads it
    several = container if isinstance(container, list) and one is None else None
    from pydantic import ValidationError

    try:
        return schemas().MountRequest(
            devices=devices,
            count=count,
            container=one,
            containers=several,
            force=force,
            share_with=share_with,
            **riders,
        )
    except ValidationError as exc:
        raise InvalidRequest(make_status(400, _problems(exc), "BadRequest")) from exc


def _request(model: str, given: dict[str, Any]) -> Any:
    """The wire model named `model` of what the caller gave (None: not given, not sent),
    or InvalidRequest before any call."""
    return _made(getattr(schemas(), model), given)


def _made(model: Any, given: dict[str, Any]) -> Any:
    from pydantic import ValidationError

    try:
        return model(**{k: v for k, v in given.items() if v is not None})
    except ValidationError as exc:
        raise InvalidRequest(make_status(400, _problems(exc), "BadRequest")) from exc


def _problems(exc: ValidationError) -> str:
    return "; ".join(
        f"{'.'.join(str(p) for p in e['loc']) or 'request'}: {e['msg']}" for e in exc.errors()
    )


def _pod_ref(ref: PodRef | tuple[str | None, ...]) -> dict[str, Any]:
    if isinstance(ref, schemas().PodRef):
        return dump(ref)
    namespace, pod, *rest = ref
    out = {"namespace": namespace, "pod": pod}
    if rest and rest[0]:
        out["container"] = rest[0]
    return out
