"""A fake `nvidia.com/gpu` device plugin: device plugin API v1beta1, GPUs by UUID.

The kubelet's device manager then accounts GPUs exactly as on a GPU node: holder
pods request `nvidia.com/gpu`, the kubelet picks devices, and PodResources reports
their UUIDs. Allocate answers only `NVIDIA_VISIBLE_DEVICES=<uuids>` (the NVIDIA
runtime's contract); there is no driver, so no device nodes are handed out.

    plugin = FakeGpuPlugin(["GPU-...", "GPU-..."]).start()   # serves and registers
    plugin.stop()
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from concurrent import futures
from pathlib import Path

import grpc

from tests.k8s.deviceplugin.generated import api_pb2, api_pb2_grpc

VERSION = "v1beta1"
DEVICE_PLUGIN_DIR = Path("/var/lib/kubelet/device-plugins")
KUBELET_SOCKET = DEVICE_PLUGIN_DIR / "kubelet.sock"


class _Servicer(api_pb2_grpc.DevicePluginServicer):
    def __init__(self, uuids: Sequence[str], stopped: threading.Event) -> None:
        self._uuids = list(uuids)
        self._stopped = stopped

    def GetDevicePluginOptions(self, request, context):  # noqa: N802 (gRPC's names)
        return api_pb2.DevicePluginOptions()

    def ListAndWatch(self, request, context) -> Iterator[api_pb2.ListAndWatchResponse]:  # noqa: N802
        devices = [api_pb2.Device(ID=uuid, health="Healthy") for uuid in self._uuids]
        yield api_pb2.ListAndWatchResponse(devices=devices)
        # The stream stays open for as long as the plugin runs: its end unregisters the GPUs.
        while not self._stopped.wait(1) and context.is_active():
            pass

    def GetPreferredAllocation(self, request, context):  # noqa: N802
        return api_pb2.PreferredAllocationResponse()

    def Allocate(self, request, context):  # noqa: N802
        responses = [
            api_pb2.ContainerAllocateResponse(
                envs={"NVIDIA_VISIBLE_DEVICES": ",".join(container.devicesIDs)}
            )
            for container in request.container_requests
        ]
        return api_pb2.AllocateResponse(container_responses=responses)

    def PreStartContainer(self, request, context):  # noqa: N802
        return api_pb2.PreStartContainerResponse()


class FakeGpuPlugin:
    """Serves the plugin on a socket in the kubelet's device-plugin directory and registers."""

    def __init__(
        self,
        uuids: Sequence[str],
        resource: str = "nvidia.com/gpu",
        directory: Path = DEVICE_PLUGIN_DIR,
        name: str = "hotmount-fake-gpu.sock",
    ) -> None:
        self.uuids = list(uuids)
        self.resource = resource
        self.directory = directory
        self.socket = directory / name
        self._stopped = threading.Event()
        self._server: grpc.Server | None = None

    def start(self, timeout: float = 30) -> FakeGpuPlugin:
        """Serve and register; again after `stop()` too."""
        self._stopped.clear()
        self.socket.unlink(missing_ok=True)
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        api_pb2_grpc.add_DevicePluginServicer_to_server(
            _Servicer(self.uuids, self._stopped), server
        )
        server.add_insecure_port(f"unix://{self.socket}")
        server.start()
        self._server = server
        with grpc.insecure_channel(f"unix://{self.directory / KUBELET_SOCKET.name}") as channel:
            grpc.channel_ready_future(channel).result(timeout=timeout)
            api_pb2_grpc.RegistrationStub(channel).Register(
                api_pb2.RegisterRequest(
                    version=VERSION, endpoint=self.socket.name, resource_name=self.resource
                ),
                timeout=timeout,
            )
        return self

    def stop(self) -> None:
        self._stopped.set()
        if self._server is not None:
            self._server.stop(grace=1).wait()
            self._server = None
        self.socket.unlink(missing_ok=True)
