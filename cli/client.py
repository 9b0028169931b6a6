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

Results are the agent's own models (`hotmount.wire.schemas`): `MountResult`, `UnmountResult`,
`PodDevices`, `DeviceList`, `ReassignResult`. Every failure raises one exception tree:

    HotmountClientError                exit 1   .status (the agent's `Status`), .reason, .code
    ├── InvalidRequest                 exit 2   400/422: bad device, container, body
    ├── Conflict                       exit 3   409: claimed, allocated, pod not running, ...
    │   └── Busy                       exit 3   DeviceBusy: a process holds the device open
    ├── NotFound                       exit 4   404: pod, container, device, node
    ├── Unauthorized                   exit 5   401
    ├── Forbidden                      exit 5   403
    ├── Timeout                        exit 6   504 from the agent, or the HTTP call timed out
    └── Unavailable                    exit 1   503, connection refused, TLS failure

Two transports, one interface: `AgentTransport` speaks the agent's `/v1` REST
paths; `AggregatedTransport` speaks `hotmount.io/v1alpha1` through the API
server (see docs/api.md). `ContainerTransport` methods (`*_container`) exist only
on a standalone agent (`hotmount-agent --no-kubernetes`).
"""

from __future__ import annotations

import ssl
from typing import TYPE_CHECKING, Any, Protocol, TypeVar
from urllib.parse import quote

from cli.connect import http_client
from cli.http import HttpClient, HttpError, HttpTimeout, Response

if TYPE_CHECKING:  # at run time imported on first use: `nvcli status` needs no pydantic
    from types import ModuleType

    from pydantic import BaseModel, ValidationError

    from hotmount.wire.schemas import (
        DeviceList,
        MountRequest,
        MountResult,
        PodDevices,
        PodRef,
        ReassignRequest,
        ReassignResult,
        Status,
        UnmountResult,
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

__all__ = [
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
    "Unauthorized",
    "Unavailable",
    "error_for",
    "http_client",
    "make_status",
    "merge_unmounts",
    "status_from_response",
]

M = TypeVar("M", bound="BaseModel")

API_GROUP = "hotmount.io"
API_VERSION = "v1alpha1"
AGGREGATED_PREFIX = f"/apis/{API_GROUP}/{API_VERSION}"


def status_from_response(response: Response) -> Status:
    """Parse an error body; the API server's own `Status` (with `metadata`) and non-JSON too."""
    from pydantic import ValidationError

    from hotmount.wire.schemas import Status

    code = response.status
    try:
        body = response.json()
    except ValueError:
        body = None
    if isinstance(body, dict) and body.get("kind") == "Status":
        fields = {k: body[k] for k in ("message", "details") if body.get(k) is not None}
        try:
            return Status(
                reason=body.get("reason") or DEFAULT_REASON.get(code, "Unknown"),
                code=int(body.get("code") or code),
                **{"message": "", **fields},
            )
        except (ValidationError, TypeError, ValueError):
            pass
    text = response.text.strip()[:300] or response.reason
    return make_status(code, f"{response.method} {response.path}: {text}")


# -- transports -----------------------------------------------------------------------------


class Transport(Protocol):
    """One way of reaching the agent. Methods return the agent's models or raise."""

    http: HttpClient
    description: str

    def mount(self, namespace: str, pod: str, request: MountRequest) -> MountResult: ...

    def unmount(
        self,
        namespace: str,
        pod: str,
        devices: list[str] | None,
        container: str | None,
        force: bool,
    ) -> UnmountResult: ...

    def status(self, namespace: str, pod: str) -> PodDevices: ...

    def status_document(self, namespace: str, pod: str) -> dict[str, Any]: ...

    def list_devices(self, node: str | None) -> list[DeviceList]: ...

    def move(self, request: ReassignRequest) -> ReassignResult: ...


class _Base:
    def __init__(self, http: HttpClient, description: str) -> None:
        self.http = http
        self.description = description

    def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            response = self.http.request(method, path, **kwargs)
        except HttpTimeout as exc:
            raise Timeout(
                make_status(504, f"no answer from {self.description} in time ({exc})", "Timeout")
            ) from exc
        except HttpError as exc:
            raise Unavailable(
                make_status(503, f"cannot reach {self.description}: {exc}", "ServiceUnavailable")
            ) from exc
        if response.is_success:
            try:
                return response.json()
            except ValueError as exc:
                raise HotmountClientError(
                    make_status(500, f"{method} {path}: the answer is not JSON", "InternalError")
                ) from exc
        raise error_for(status_from_response(response))

    def _every_node(self) -> list[DeviceList]:
        """`hotmount.io/v1alpha1` nodedevices: each node's list, the answering agent having
        asked every other agent, then an entry for each node that did not answer."""
        data = self._call("GET", f"{AGGREGATED_PREFIX}/nodedevices")
        from cli.partial import unlisted  # the nodes that did not answer, named by the agent

        listings = [self._node_devices(item) for item in (data.get("items") or [])]
        return [*listings, *unlisted(data.get("metadata"))]

    def _node_devices(self, obj: Any) -> DeviceList:
        listing = self._parse("DeviceList", _status_of(obj), "NodeDevices status")
        name = (obj.get("metadata") or {}).get("name")
        if listing.node is None and name:
            listing.node = name
        return listing

    def _parse(self, model: str, data: Any, what: str) -> Any:
        """`data` as the agent model named `model` (hotmount.wire.schemas, imported here)."""
        from pydantic import ValidationError

        try:
            return getattr(_schemas(), model).model_validate(data)
        except ValidationError as exc:
            raise HotmountClientError(
                make_status(
                    500,
                    f"unexpected answer from {self.description} ({what}): {exc}",
                    "InternalError",
                )
            ) from exc


def _pod_devices_document(data: Any, description: str, what: str) -> dict[str, Any]:
    """A `PodDevices` reply as the JSON it is, its shape checked but no model built: what
    `nvcli status` renders (pydantic and the models cost more than the request)."""
    containers = data.get("containers") if isinstance(data, dict) else None
    if isinstance(containers, list) and all(
        isinstance(c, dict) and isinstance(c.get("devices"), list)
        and all(isinstance(d, dict) for d in c["devices"])
        for c in containers
    ):  # fmt: skip
        return data
    raise HotmountClientError(
        make_status(
            500,
            f"unexpected answer from {description} ({what}): not a PodDevices document",
            "InternalError",
        )
    )


def _schemas() -> ModuleType:
    """The agent's models, imported on first use (pydantic and every model: ~0.15 s)."""
    import hotmount.wire.schemas

    return hotmount.wire.schemas


def _segment(value: str) -> str:
    """One path segment: CDI names hold '/' and '='."""
    return quote(value, safe="")


def _dump(model: BaseModel) -> dict[str, Any]:
    return model.model_dump(mode="json", by_alias=True, exclude_none=True)


class AgentTransport(_Base):
    """The agent's own REST API under `/v1` (docs/api.md, "Direct REST")."""

    def mount(self, namespace: str, pod: str, request: MountRequest) -> MountResult:
        data = self._call(
            "POST",
            f"/v1/namespaces/{_segment(namespace)}/pods/{_segment(pod)}/devices",
            body=_dump(request),
        )
        return self._parse("MountResult", data, "MountResult")

    def unmount(
        self,
        namespace: str,
        pod: str,
        devices: list[str] | None,
        container: str | None,
        force: bool,
    ) -> UnmountResult:
        base = f"/v1/namespaces/{_segment(namespace)}/pods/{_segment(pod)}/devices"
        if devices is None:  # every hot-mounted device of the pod (of `container` if named)
            current = self.status(namespace, pod)
            devices = [
                d.key
                for c in current.containers
                if container is None or c.container == container
                for d in c.devices
            ]
            if not devices:
                cid = current.containers[0].container_id if current.containers else ""
                return _schemas().UnmountResult(
                    namespace=namespace,
                    pod=pod,
                    container=container,
                    container_id=cid,
                    unmounted=[],
                    not_mounted=[],
                    stopped_pids=[],
                )
        params = _unmount_params(container, force)
        results = [
            self._parse(
                "UnmountResult",
                self._call("DELETE", f"{base}/{_segment(d)}", params=params),
                "UnmountResult",
            )
            for d in devices
        ]
        return merge_unmounts(results)

    def status(self, namespace: str, pod: str) -> PodDevices:
        return self._parse("PodDevices", self.status_document(namespace, pod), "PodDevices")

    def status_document(self, namespace: str, pod: str) -> dict[str, Any]:
        data = self._call(
            "GET", f"/v1/namespaces/{_segment(namespace)}/pods/{_segment(pod)}/devices"
        )
        return _pod_devices_document(data, self.description, "PodDevices")

    def list_devices(self, node: str | None) -> list[DeviceList]:
        listing = self._parse("DeviceList", self._call("GET", "/v1/devices"), "DeviceList")
        if node is not None and listing.node is not None and listing.node != node:
            raise NotFound(
                make_status(
                    404,
                    f"{self.description} serves node {listing.node!r}, not {node!r}",
                    "NotFound",
                    name=node,
                    kind="nodedevices",
                )
            )
        return [listing]

    def move(self, request: ReassignRequest) -> ReassignResult:
        data = self._call("POST", "/v1/reassign", body=_dump(request))
        return self._parse("ReassignResult", data, "ReassignResult")

    # standalone agents (`--no-kubernetes`): containers by ID
    def mount_container(self, container_id: str, request: MountRequest) -> MountResult:
        data = self._call(
            "POST", f"/v1/containers/{_segment(container_id)}/devices", body=_dump(request)
        )
        return self._parse("MountResult", data, "MountResult")

    def unmount_container(
        self, container_id: str, devices: list[str] | None, force: bool
    ) -> UnmountResult:
        base = f"/v1/containers/{_segment(container_id)}/devices"
        if devices is None:
            current = self.container_status(container_id)
            devices = [d.key for c in current.containers for d in c.devices]
        params = _unmount_params(None, force)
        results = [
            self._parse(
                "UnmountResult",
                self._call("DELETE", f"{base}/{_segment(d)}", params=params),
                "UnmountResult",
            )
            for d in devices
        ]
        if not results:
            return _schemas().UnmountResult(
                container_id=container_id, unmounted=[], not_mounted=[], stopped_pids=[]
            )
        return merge_unmounts(results)

    def container_status(self, container_id: str) -> PodDevices:
        data = self.container_status_document(container_id)
        return self._parse("PodDevices", data, "PodDevices")

    def container_status_document(self, container_id: str) -> dict[str, Any]:
        data = self._call("GET", f"/v1/containers/{_segment(container_id)}/devices")
        return _pod_devices_document(data, self.description, "PodDevices")


class AggregatedTransport(_Base):
    """`hotmount.io/v1alpha1` through the API server (docs/api.md, "Aggregated API")."""

    def mount(self, namespace: str, pod: str, request: MountRequest) -> MountResult:
        body = {
            "apiVersion": f"{API_GROUP}/{API_VERSION}",
            "kind": "GPUMount",
            "metadata": {"name": pod, "namespace": namespace},
            "spec": _dump(request),
        }
        data = self._call(
            "POST", f"{AGGREGATED_PREFIX}/namespaces/{_segment(namespace)}/gpumounts", body=body
        )
        return self._parse("MountResult", _status_of(data), "GPUMount status")

    def unmount(
        self,
        namespace: str,
        pod: str,
        devices: list[str] | None,
        container: str | None,
        force: bool,
    ) -> UnmountResult:
        params: list[tuple[str, str]] = [("device", d) for d in devices or []]
        params += list(_unmount_params(container, force).items())
        data = self._call(
            "DELETE",
            f"{AGGREGATED_PREFIX}/namespaces/{_segment(namespace)}/gpumounts/{_segment(pod)}",
            params=params,
        )
        return self._parse("UnmountResult", _status_of(data), "GPUMount status")

    def status(self, namespace: str, pod: str) -> PodDevices:
        data = self.status_document(namespace, pod)
        return self._parse("PodDevices", data, "GPUMount status")

    def status_document(self, namespace: str, pod: str) -> dict[str, Any]:
        data = self._call(
            "GET", f"{AGGREGATED_PREFIX}/namespaces/{_segment(namespace)}/gpumounts/{_segment(pod)}"
        )
        return _pod_devices_document(_status_of(data), self.description, "GPUMount status")

    def list_devices(self, node: str | None) -> list[DeviceList]:
        if node is not None:
            data = self._call("GET", f"{AGGREGATED_PREFIX}/nodedevices/{_segment(node)}")
            return [self._node_devices(data)]
        return self._every_node()

    def pod_names(self, namespace: str) -> list[str]:
        data = self._call("GET", f"/api/v1/namespaces/{_segment(namespace)}/pods",
                          params=[("limit", "500")])  # fmt: skip
        items = data.get("items") if isinstance(data, dict) else None
        return [str(i["metadata"]["name"]) for i in items or [] if i.get("metadata")]

    def move(self, request: ReassignRequest) -> ReassignResult:
        """Within one namespace, a namespaced Reassignment: the API server authorizes it
        in that namespace, so a RoleBinding is enough. Across namespaces, the cluster-scoped
        one, which needs `create reassignments` at the cluster scope."""
        body: dict[str, Any] = {
            "apiVersion": f"{API_GROUP}/{API_VERSION}",
            "kind": "Reassignment",
            "spec": _dump(request),
        }
        namespace = request.from_.namespace
        if namespace == request.to.namespace:
            body["metadata"] = {"namespace": namespace}
            path = f"{AGGREGATED_PREFIX}/namespaces/{_segment(namespace)}/reassignments"
        else:
            path = f"{AGGREGATED_PREFIX}/reassignments"
        data = self._call("POST", path, body=body)
        return self._parse("ReassignResult", _status_of(data), "Reassignment status")


def _status_of(obj: Any) -> Any:
    return obj.get("status") if isinstance(obj, dict) else None


def _unmount_params(container: str | None, force: bool) -> dict[str, str]:
    params = {}
    if force:
        params["force"] = "true"
    if container:
        params["container"] = container
    return params


def merge_unmounts(results: list[UnmountResult]) -> UnmountResult:
    """One answer for several per-device DELETEs of the same container."""
    first = results[0]
    return first.model_copy(
        update={
            "unmounted": [k for r in results for k in r.unmounted],
            "not_mounted": [k for r in results for k in r.not_mounted],
            "stopped_pids": sorted({p for r in results for p in r.stopped_pids}),
            "holder_pods_deleted": [p for r in results for p in r.holder_pods_deleted],
        }
    )


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
            from cli.cleartext import refuse_plain_credentials

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
        from cli.kubeconfig import aggregated_http_client, load

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
            return self.transport._every_node()
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
            request = _schemas().ReassignRequest.model_validate(
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
        return _schemas().MountRequest(
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


def _problems(exc: ValidationError) -> str:
    return "; ".join(
        f"{'.'.join(str(p) for p in e['loc']) or 'request'}: {e['msg']}" for e in exc.errors()
    )


def _pod_ref(ref: PodRef | tuple[str | None, ...]) -> dict[str, Any]:
    if isinstance(ref, _schemas().PodRef):
        return _dump(ref)
    namespace, pod, *rest = ref
    out = {"namespace": namespace, "pod": pod}
    if rest and rest[0]:
        out["container"] = rest[0]
    return out
