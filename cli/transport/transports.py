"""How nvcli's client reaches an agent: two transports, one interface (`Transport`).

`AgentTransport` speaks the agent's `/v1` REST paths; `AggregatedTransport` speaks
`hotmount.io/v1alpha1` through the API server (docs/api.md). Each turns one operation
into its face's path and body, and the answer into a wire model (hotmount/wire/schemas.py)
or a `HotmountClientError`. The `*_container` methods are AgentTransport's alone: only a
standalone agent (`hotmount-agent --no-kubernetes`) serves containers by ID.
`HotmountClient` (cli/client.py) is the typed face people call; nothing outside these two
modules builds a path or calls `_call`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal, Protocol
from urllib.parse import quote

from cli.transport.http import HttpClient, HttpError, HttpTimeout, Response
from hotmount.wire.errors import (
    DEFAULT_REASON,
    HotmountClientError,
    NotFound,
    Timeout,
    Unavailable,
    error_for,
    make_status,
)

if TYPE_CHECKING:  # at run time imported on first use: `nvcli status` needs no pydantic
    from types import ModuleType

    from pydantic import BaseModel

    from hotmount.wire.schemas import (
        DeviceList,
        MountRequest,
        MountResult,
        OperationProgress,
        PodDevices,
        ReassignRequest,
        ReassignResult,
        ResumeRequest,
        ResumeResult,
        Status,
        SuspendRequest,
        SuspendResult,
        UnmountResult,
    )

Op = Literal["suspend", "resume"]
OnDemandOp = Literal["acquire", "release"]

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

    def suspend(self, namespace: str, pod: str, request: SuspendRequest) -> SuspendResult: ...

    def resume(self, namespace: str, pod: str, request: ResumeRequest) -> ResumeResult: ...

    def progress(
        self, namespace: str, pod: str, op: Op, container: str | None
    ) -> OperationProgress: ...

    def on_demand(self, namespace: str, pod: str, op: OnDemandOp, request: BaseModel) -> Any: ...


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

    def every_node(self) -> list[DeviceList]:
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

    def _parse(self, model: str | type[BaseModel], data: Any, what: str) -> Any:
        """`data` as the agent model `model`, or named `model` (hotmount.wire.schemas,
        imported here)."""
        from pydantic import ValidationError

        cls = getattr(schemas(), model) if isinstance(model, str) else model
        try:
            return cls.model_validate(data)
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


def schemas() -> ModuleType:
    """The wire's models, imported on first use (pydantic and every model: ~0.15 s)."""
    import hotmount.wire.schemas

    return hotmount.wire.schemas


def _segment(value: str) -> str:
    """One path segment: CDI names hold '/' and '='."""
    return quote(value, safe="")


def dump(model: BaseModel, exclude_unset: bool = False) -> dict[str, Any]:
    """A request's JSON body; `exclude_unset`: only the fields the caller gave (the agent
    applies its own defaults, as when they were left out by hand)."""
    return model.model_dump(
        mode="json", by_alias=True, exclude_none=True, exclude_unset=exclude_unset
    )


class AgentTransport(_Base):
    """The agent's own REST API under `/v1` (docs/api.md, "Direct REST")."""

    def mount(self, namespace: str, pod: str, request: MountRequest) -> MountResult:
        data = self._call(
            "POST",
            f"/v1/namespaces/{_segment(namespace)}/pods/{_segment(pod)}/devices",
            body=dump(request),
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
                return schemas().UnmountResult(
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
        data = self._call("POST", "/v1/reassign", body=dump(request))
        return self._parse("ReassignResult", data, "ReassignResult")

    def suspend(self, namespace: str, pod: str, request: SuspendRequest) -> SuspendResult:
        body = dump(request, exclude_unset=True)
        data = self._call("POST", _pod_path(namespace, pod, "suspend"), body=body)
        return self._parse("SuspendResult", data, "SuspendResult")

    def resume(self, namespace: str, pod: str, request: ResumeRequest) -> ResumeResult:
        body = dump(request, exclude_unset=True)
        data = self._call("POST", _pod_path(namespace, pod, "resume"), body=body)
        return self._parse("ResumeResult", data, "ResumeResult")

    def progress(
        self, namespace: str, pod: str, op: Op, container: str | None
    ) -> OperationProgress:
        """GET on the POST's own path: the suspend or resume running on the pod."""
        data = self._call("GET", _pod_path(namespace, pod, op), params=_container(container))
        return self._parse("OperationProgress", data, "OperationProgress")

    def on_demand(self, namespace: str, pod: str, op: OnDemandOp, request: BaseModel) -> Any:
        """POST .../acquire or .../release: an AcquireResult or ReleaseResult."""
        body = dump(request, exclude_unset=True)
        data = self._call("POST", _pod_path(namespace, pod, op), body=body)
        return self._parse(_on_demand_result(op), data, f"{op} result")

    # standalone agents (`--no-kubernetes`): containers by ID
    def mount_container(self, container_id: str, request: MountRequest) -> MountResult:
        data = self._call(
            "POST", f"/v1/containers/{_segment(container_id)}/devices", body=dump(request)
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
            return schemas().UnmountResult(
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
            "spec": dump(request),
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
        return self.every_node()

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
            "spec": dump(request),
        }
        namespace = request.from_.namespace
        if namespace == request.to.namespace:
            body["metadata"] = {"namespace": namespace}
            path = f"{AGGREGATED_PREFIX}/namespaces/{_segment(namespace)}/reassignments"
        else:
            path = f"{AGGREGATED_PREFIX}/reassignments"
        data = self._call("POST", path, body=body)
        return self._parse("ReassignResult", _status_of(data), "Reassignment status")

    def suspend(self, namespace: str, pod: str, request: SuspendRequest) -> SuspendResult:
        """GPUMount's subresource `suspend`: the request as its body, the result in the
        object's status."""
        body = dump(request, exclude_unset=True)
        data = self._call("POST", f"{_gpumount(namespace, pod)}/suspend", body=body)
        return self._parse("SuspendResult", _status_of(data), "GPUMount suspend status")

    def resume(self, namespace: str, pod: str, request: ResumeRequest) -> ResumeResult:
        body = dump(request, exclude_unset=True)
        data = self._call("POST", f"{_gpumount(namespace, pod)}/resume", body=body)
        return self._parse("ResumeResult", _status_of(data), "GPUMount resume status")

    def progress(
        self, namespace: str, pod: str, op: Op, container: str | None
    ) -> OperationProgress:
        path = f"{_gpumount(namespace, pod)}/{op}"
        data = self._call("GET", path, params=_container(container))
        return self._parse("OperationProgress", _status_of(data), f"GPUMount {op} status")

    def on_demand(self, namespace: str, pod: str, op: OnDemandOp, request: BaseModel) -> Any:
        """GPUMount's subresource `acquire` or `release`: the result in the status."""
        body = dump(request, exclude_unset=True)
        data = self._call("POST", f"{_gpumount(namespace, pod)}/{op}", body=body)
        return self._parse(_on_demand_result(op), _status_of(data), f"GPUMount {op} status")


def _on_demand_result(op: OnDemandOp) -> type[BaseModel]:
    from hotmount.wire import ondemand

    return ondemand.AcquireResult if op == "acquire" else ondemand.ReleaseResult


def _pod_path(namespace: str, pod: str, verb: str) -> str:
    return f"/v1/namespaces/{_segment(namespace)}/pods/{_segment(pod)}/{verb}"


def _gpumount(namespace: str, pod: str) -> str:
    return f"{AGGREGATED_PREFIX}/namespaces/{_segment(namespace)}/gpumounts/{_segment(pod)}"


def _container(container: str | None) -> dict[str, str] | None:
    return {"container": container} if container else None


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
