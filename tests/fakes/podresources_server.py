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

from agent.podresources.generated import api_pb2, api_pb2_grpc

# pod (namespace, name) -> container -> resource -> device ids
Table = dict[tuple[str, str], dict[str, dict[str, list[str]]]]


class _Servicer(api_pb2_grpc.PodResourcesListerServicer):
    def __init__(self, owner: FakePodResourcesServer) -> None:
        self._owner = owner

    # Method names are the gRPC service's.
    def List(  # noqa: N802
        self, request: api_pb2.ListPodResourcesRequest, context: grpc.ServicerContext
    ) -> api_pb2.ListPodResourcesResponse:
        with self._owner.lock:
            pods = [_pod_message(key, containers) for key, containers in self._owner.table.items()]
        return api_pb2.ListPodResourcesResponse(pod_resources=pods)

    def GetAllocatableResources(  # noqa: N802
        self, request: api_pb2.AllocatableResourcesRequest, context: grpc.ServicerContext
    ) -> api_pb2.AllocatableResourcesResponse:
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
        with self._owner.lock:
            containers = self._owner.table.get(key)
            pod = _pod_message(key, containers) if containers is not None else None
        if pod is None:
            # The kubelet returns a plain Go error here, which gRPC reports as UNKNOWN.
            context.abort(
                grpc.StatusCode.UNKNOWN,
                f"pod {request.pod_name} in namespace {request.pod_namespace} not found",
            )
        return api_pb2.GetPodResourcesResponse(pod_resources=pod)


_CDI_CLAIM = "cdi-claim:"  # table entries that are DRA claims, not device plugins


def _pod_message(
    key: tuple[str, str], containers: dict[str, dict[str, list[str]]]
) -> api_pb2.PodResources:
    namespace, name = key
    return api_pb2.PodResources(
        namespace=namespace,
        name=name,
        containers=[
            api_pb2.ContainerResources(
                name=container,
                devices=[
                    api_pb2.ContainerDevices(resource_name=resource, device_ids=ids)
                    for resource, ids in resources.items()
                    if not resource.startswith(_CDI_CLAIM)
                ],
                dynamic_resources=[
                    api_pb2.DynamicResource(
                        class_name="gpu.nvidia.com",
                        claim_name=resource.removeprefix(_CDI_CLAIM),
                        claim_namespace=namespace,
                        claim_resources=[
                            api_pb2.ClaimResource(
                                cdi_devices=[api_pb2.CDIDevice(name=n) for n in ids]
                            )
                        ],
                    )
                    for resource, ids in resources.items()
                    if resource.startswith(_CDI_CLAIM)
                ],
            )
            for container, resources in containers.items()
        ],
    )


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
        self.allocatable_devices: dict[str, list[str]] = dict(allocatable or {})
        self.allocatable_unimplemented = allocatable_unimplemented
        self._server: grpc.Server | None = None

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

    def remove_pod(self, namespace: str, pod: str) -> None:
        with self.lock:
            self.table.pop((namespace, pod), None)

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
