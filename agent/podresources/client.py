"""Read the kubelet's device allocations over the PodResources v1 gRPC API.

The kubelet is the only authority on which GPUs it gave to which container, so
the agent asks it before hot-mounting (never mount a GPU another pod owns) and
to learn which devices a holder pod received when mounting by count.

Errors: every gRPC failure becomes :class:`PodResourcesError`, except
UNIMPLEMENTED from ``GetAllocatableResources``, which a 1.20 kubelet answers
and which means "unknown" (``allocatable()`` returns ``None``).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from types import TracebackType

import grpc

from agent.podresources.generated import api_pb2, api_pb2_grpc

DEFAULT_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
# The kubelet's own clients cap messages at 16 MiB (podresources.DefaultMaxMsgSize);
# a node with many pods easily exceeds gRPC's 4 MiB default.
MAX_MESSAGE_BYTES = 16 * 1024 * 1024
# The kubelet serves PodResources at 100 calls a second (burst 10) for all its clients
# together and refuses the rest with RESOURCE_EXHAUSTED "rejected by rate limit". A pin
# reads it every few tens of milliseconds while the kubelet admits, beside monitoring
# agents that read it too: a refused call is tried again after a short, growing pause
# (gRPC's own retry policy: 20 ms, then up to 320 ms, jittered; five calls in all).
RETRY_RATE_LIMITED = json.dumps(
    {
        "methodConfig": [
            {
                "name": [{"service": "v1.PodResourcesLister"}],
                "retryPolicy": {
                    "maxAttempts": 5,
                    "initialBackoff": "0.02s",
                    "maxBackoff": "0.32s",
                    "backoffMultiplier": 2,
                    "retryableStatusCodes": ["RESOURCE_EXHAUSTED"],
                },
            }
        ]
    }
)


class PodResourcesError(Exception):
    """The kubelet PodResources API could not answer; ``code`` is the gRPC status."""

    def __init__(self, message: str, code: grpc.StatusCode | None = None) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class Allocation:
    """Devices of one resource that the kubelet assigned to one container."""

    pod_namespace: str
    pod_name: str
    container_name: str
    resource_name: str
    device_ids: tuple[str, ...]


@dataclass(frozen=True)
class ClaimAllocation:
    """One DRA device the kubelet prepared for a container, named as the scheduler's books
    name it (driver, pool, device in a ResourceSlice) so it can be matched to a GPU UUID.

    ``namespace`` and ``claim`` are the ResourceClaim's. A kubelet older than 1.31 reports
    only ``cdi_devices``; ``driver``, ``pool`` and ``device`` are then empty.
    """

    namespace: str
    claim: str
    driver: str
    pool: str
    device: str
    cdi_devices: tuple[str, ...]


def _target(socket_path: str) -> str:
    """gRPC target for a unix socket; absolute paths need the ``unix://`` form."""
    if os.path.isabs(socket_path):
        return f"unix://{socket_path}"
    return f"unix:{socket_path}"


class PodResourcesClient:
    """Synchronous client for ``v1.PodResourcesLister`` on the kubelet's unix socket."""

    def __init__(self, socket_path: str = DEFAULT_SOCKET, timeout: float = 5.0) -> None:
        self.socket_path = socket_path
        self.timeout = timeout
        self._open()

    def _open(self) -> None:
        """A fresh channel. After UNAVAILABLE the old one sits in reconnect backoff (up to
        minutes) and would answer UNAVAILABLE at once even though the kubelet is back; a
        new one connects on the next call. The old one is left to in-flight calls, not closed."""
        self._channel = grpc.insecure_channel(
            _target(self.socket_path),
            options=[
                ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                ("grpc.enable_retries", 1),
                ("grpc.service_config", RETRY_RATE_LIMITED),
            ],
        )
        self._stub = api_pb2_grpc.PodResourcesListerStub(self._channel)

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> PodResourcesClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def list_allocations(self) -> list[Allocation]:
        """Every (container, resource) that holds devices on this node, flattened."""
        try:
            response = self._stub.List(api_pb2.ListPodResourcesRequest(), timeout=self.timeout)
        except grpc.RpcError as err:
            raise self._error("List", err) from err
        allocations: list[Allocation] = []
        for pod in response.pod_resources:
            for container in pod.containers:
                for devices in container.devices:
                    if not devices.device_ids:
                        continue
                    allocations.append(
                        Allocation(
                            pod_namespace=pod.namespace,
                            pod_name=pod.name,
                            container_name=container.name,
                            resource_name=devices.resource_name,
                            device_ids=tuple(devices.device_ids),
                        )
                    )
                for dynamic in container.dynamic_resources:
                    # DRA: the kubelet reports fully qualified CDI names (vendor/class=name).
                    names = [d.name for r in dynamic.claim_resources for d in r.cdi_devices]
                    if names:
                        allocations.append(
                            Allocation(
                                pod_namespace=pod.namespace,
                                pod_name=pod.name,
                                container_name=container.name,
                                resource_name=dynamic.class_name or dynamic.claim_name,
                                device_ids=tuple(names),
                            )
                        )
        return allocations

    def list_claim_allocations(self) -> list[tuple[str, str, str, ClaimAllocation]]:
        """(pod namespace, pod name, container, device) for every DRA device on this node."""
        try:
            response = self._stub.List(api_pb2.ListPodResourcesRequest(), timeout=self.timeout)
        except grpc.RpcError as err:
            raise self._error("List", err) from err
        found: list[tuple[str, str, str, ClaimAllocation]] = []
        for pod in response.pod_resources:
            for container in pod.containers:
                for dynamic in container.dynamic_resources:
                    for resource in dynamic.claim_resources:
                        allocation = ClaimAllocation(
                            namespace=dynamic.claim_namespace,
                            claim=dynamic.claim_name,
                            driver=resource.driver_name,
                            pool=resource.pool_name,
                            device=resource.device_name,
                            cdi_devices=tuple(d.name for d in resource.cdi_devices),
                        )
                        found.append((pod.namespace, pod.name, container.name, allocation))
        return found

    def allocatable(self, resource_name: str) -> list[str] | None:
        """Device IDs the kubelet may hand out for ``resource_name``; None if it cannot say.

        A 1.20 kubelet has no GetAllocatableResources and answers UNIMPLEMENTED;
        that is "unknown", not a failure (docs/api.md, "Accounting").
        """
        try:
            response = self._stub.GetAllocatableResources(
                api_pb2.AllocatableResourcesRequest(), timeout=self.timeout
            )
        except grpc.RpcError as err:
            if _code(err) == grpc.StatusCode.UNIMPLEMENTED:
                return None
            raise self._error("GetAllocatableResources", err) from err
        ids: dict[str, None] = {}  # ordered set: devices come grouped by NUMA node
        for devices in response.devices:
            if devices.resource_name == resource_name:
                ids.update(dict.fromkeys(devices.device_ids))
        return list(ids)

    def _error(self, method: str, err: grpc.RpcError) -> PodResourcesError:
        code = _code(err)
        details = err.details() if isinstance(err, grpc.Call) else str(err)
        hint = ""
        if code == grpc.StatusCode.UNAVAILABLE:
            hint = " (is the kubelet running and the socket mounted into the agent?)"
            self._open()
        elif code == grpc.StatusCode.UNIMPLEMENTED:
            hint = " (kubelet older than 1.20 serves only v1alpha1)"
        name = code.name if code is not None else "UNKNOWN"
        return PodResourcesError(
            f"kubelet PodResources {method} on {self.socket_path} failed: {name}: {details}{hint}",
            code,
        )


def _code(err: grpc.RpcError) -> grpc.StatusCode | None:
    return err.code() if isinstance(err, grpc.Call) else None
