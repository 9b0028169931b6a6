"""A real gRPC ``v1.PodResourcesLister`` on a unix socket, fed from an in-memory table.

Tests talk to it exactly as the agent talks to the kubelet, so the stubs, the
socket target and the error codes are exercised, not mocked.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
from concurrent import futures
from types import TracebackType

import grpc

from agent.podresources.client import ClaimAllocation
from agent.podresources.generated import api_pb2, api_pb2_grpc

# pod (namespace, name) -> container -> resource -> device ids
Table = dict[tuple[str, str], dict[str, dict[str, list[str]]]]
# pod (namespace, name) -> container -> DRA devices, as a 1.34 kubelet reports them
Claims = dict[tuple[str, str], dict[str, list[ClaimAllocation]]]


class _Servicer(api_pb2_grpc.PodResourcesListerServicer):
    def __init__(self, owner: FakePodResourcesServer) -> None:
        self._owner = owner

    # Method names are the gRPC service's.
    def List(  # noqa: N802
        self, request: api_pb2.ListPodResourcesRequest, context: grpc.ServicerContext
    ) -> api_pb2.ListPodResourcesResponse:
        owner = self._owner
        owner.take_token(context)
        with owner.lock:
            keys = dict.fromkeys([*owner.table, *owner.claims])
            pods = [
                _pod_message(key, owner.table.get(key, {}), owner.claims.get(key, {}))
                for key in keys
            ]
        return api_pb2.ListPodResourcesResponse(pod_resources=pods)

    def GetAllocatableResources(  # noqa: N802
        self, request: api_pb2.AllocatableResourcesRequest, context: grpc.ServicerContext
    ) -> api_pb2.AllocatableResourcesResponse:
        self._owner.take_token(context)
        if self._owner.allocatable_unimplemented:
            # What grpc-go answers for a method missing from a 1.20 kubelet's service.
            context.abort(
                grpc.StatusCode.UNIMPLEMENTED,
                "unknown method GetAllocatableResources for service v1.PodResourcesLister",
            )
        with self._owner.lock:
            devices = [
                api_pb2.ContainerDevices(resource_name=resource, device_ids=ids)
                for resource, ids in self._owner.allocatable_devices.items()
            ]
        return api_pb2.AllocatableResourcesResponse(devices=devices)

    def Get(  # noqa: N802
        self, request: api_pb2.GetPodResourcesRequest, context: grpc.ServicerContext
    ) -> api_pb2.GetPodResourcesResponse:
        key = (request.pod_namespace, request.pod_name)
        owner = self._owner
        with owner.lock:
            known = key in owner.table or key in owner.claims
            pod = (
                _pod_message(key, owner.table.get(key, {}), owner.claims.get(key, {}))
                if known
                else None
            )
        if pod is None:
            # The kubelet returns a plain Go error here, which gRPC reports as UNKNOWN.
            context.abort(
                grpc.StatusCode.UNKNOWN,
                f"pod {request.pod_name} in namespace {request.pod_namespace} not found",
            )
        return api_pb2.GetPodResourcesResponse(pod_resources=pod)


_CDI_CLAIM = "cdi-claim:"  # table entries that are DRA claims, not device plugins


def _pod_message(
    key: tuple[str, str],
    containers: dict[str, dict[str, list[str]]],
    claims: dict[str, list[ClaimAllocation]],
) -> api_pb2.PodResources:
    namespace, name = key
    names = dict.fromkeys([*containers, *claims])
    return api_pb2.PodResources(
        namespace=namespace,
        name=name,
        containers=[
            _container_message(namespace, container, containers.get(container, {}), claims)
            for container in names
        ],
    )


def _container_message(
    namespace: str,
    container: str,
    resources: dict[str, list[str]],
    claims: dict[str, list[ClaimAllocation]],
) -> api_pb2.ContainerResources:
    return api_pb2.ContainerResources(
        name=container,
        devices=[
            api_pb2.ContainerDevices(resource_name=resource, device_ids=ids)
            for resource, ids in resources.items()
            if not resource.startswith(_CDI_CLAIM)
        ],
        dynamic_resources=[
            # The pre-1.31 shape (set_cdi_allocation): a class name and CDI names only.
            *(
                api_pb2.DynamicResource(
                    class_name="gpu.nvidia.com",
                    claim_name=resource.removeprefix(_CDI_CLAIM),
                    claim_namespace=namespace,
                    claim_resources=[
                        api_pb2.ClaimResource(cdi_devices=[api_pb2.CDIDevice(name=n) for n in ids])
                    ],
                )
                for resource, ids in resources.items()
                if resource.startswith(_CDI_CLAIM)
            ),
            *_dynamic_resources(claims.get(container, [])),
        ],
    )


def _dynamic_resources(allocations: list[ClaimAllocation]) -> list[api_pb2.DynamicResource]:
    """As a 1.34 kubelet reports DRA: one DynamicResource per claim (no class name), one
    ClaimResource per device, named by driver, pool and device."""
    claims: dict[tuple[str, str], list[ClaimAllocation]] = {}
    for allocation in allocations:
        claims.setdefault((allocation.namespace, allocation.claim), []).append(allocation)
    return [
        api_pb2.DynamicResource(
            claim_name=claim,
            claim_namespace=namespace,
            claim_resources=[
                api_pb2.ClaimResource(
                    cdi_devices=[api_pb2.CDIDevice(name=n) for n in a.cdi_devices],
                    driver_name=a.driver,
                    pool_name=a.pool,
                    device_name=a.device,
                )
                for a in devices
            ],
        )
        for (namespace, claim), devices in claims.items()
    ]


def _device_key(a: ClaimAllocation) -> tuple[str, str, str, str, str]:
    return (a.namespace, a.claim, a.driver, a.pool, a.device)


class FakePodResourcesServer:
    """Kubelet PodResources stand-in. Mutate it with the helpers; they are thread-safe.

    ``socket_path`` defaults to a fresh short temp dir: unix socket paths are
    limited to 107 bytes, which pytest's ``tmp_path`` can exceed.
    """

    def __init__(
        self,
        socket_path: str | None = None,
        *,
        allocatable: dict[str, list[str]] | None = None,
        allocatable_unimplemented: bool = False,
    ) -> None:
        self._own_dir: str | None = None
        if socket_path is None:
            self._own_dir = tempfile.mkdtemp(prefix="podres-")
            socket_path = os.path.join(self._own_dir, "kubelet.sock")
        self.socket_path = socket_path
        self.lock = threading.RLock()
        self.table: Table = {}
        self.claims: Claims = {}
        self.allocatable_devices: dict[str, list[str]] = dict(allocatable or {})
        self.allocatable_unimplemented = allocatable_unimplemented
        self.refuse_next = 0  # calls still to refuse as the kubelet's rate limit does
        self.refused = 0
        self._server: grpc.Server | None = None

    def take_token(self, context: grpc.ServicerContext) -> None:
        """The kubelet limits PodResources to 100 calls a second (burst 10) for all its
        clients together, and refuses the rest with RESOURCE_EXHAUSTED: `refuse_next`
        makes the next calls meet that limit."""
        with self.lock:
            if self.refuse_next <= 0:
                return
            self.refuse_next -= 1
            self.refused += 1
        context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "rejected by rate limit")

    # -- table helpers -----------------------------------------------------
    def set_allocation(
        self, namespace: str, pod: str, container: str, resource: str, device_ids: list[str]
    ) -> None:
        with self.lock:
            self.table.setdefault((namespace, pod), {}).setdefault(container, {})[resource] = list(
                device_ids
            )

    def set_cdi_allocation(
        self, namespace: str, pod: str, container: str, claim: str, cdi_names: list[str]
    ) -> None:
        """A DRA claim's devices, reported as fully qualified CDI names."""
        self.set_allocation(namespace, pod, container, f"{_CDI_CLAIM}{claim}", cdi_names)

    def set_claim_allocation(
        self, namespace: str, pod: str, container: str, allocation: ClaimAllocation
    ) -> None:
        """A DRA device prepared for a container; replaces the same claim's same device."""
        with self.lock:
            devices = self.claims.setdefault((namespace, pod), {}).setdefault(container, [])
            devices[:] = [a for a in devices if _device_key(a) != _device_key(allocation)]
            devices.append(allocation)

    def remove_pod(self, namespace: str, pod: str) -> None:
        with self.lock:
            self.table.pop((namespace, pod), None)
            self.claims.pop((namespace, pod), None)

    def set_allocatable(self, resource: str, device_ids: list[str]) -> None:
        with self.lock:
            self.allocatable_devices[resource] = list(device_ids)

    def allocations(self) -> Table:
        """A deep copy of the table, for assertions."""
        with self.lock:
            return {
                key: {c: {r: list(ids) for r, ids in res.items()} for c, res in containers.items()}
                for key, containers in self.table.items()
            }

    def claim_allocations(self) -> Claims:
        """A copy of the DRA table, for assertions."""
        with self.lock:
            return {
                key: {c: list(devices) for c, devices in containers.items()}
                for key, containers in self.claims.items()
            }

    # -- lifecycle -----------------------------------------------------------
    def start(self) -> FakePodResourcesServer:
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        api_pb2_grpc.add_PodResourcesListerServicer_to_server(_Servicer(self), server)
        if server.add_insecure_port(f"unix://{self.socket_path}") == 0:
            raise RuntimeError(f"cannot bind fake PodResources server to {self.socket_path}")
        server.start()
        self._server = server
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop(grace=None).wait()
            self._server = None
        if self._own_dir is not None:
            shutil.rmtree(self._own_dir, ignore_errors=True)
            self._own_dir = None

    def __enter__(self) -> FakePodResourcesServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
