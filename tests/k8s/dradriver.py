"""The DRA example driver on the real node (flow 25, bench/pin_bench.py --dra).

`sigs.k8s.io/dra-example-driver`'s kubelet plugin, built from its Go module by
`node/build-dra-driver.sh`, runs on the host as `gpu.example.com`: it registers with
the kubelet (plugins_registry), publishes one ResourceSlice for the node, and prepares
claims by writing CDI specs to /var/run/cdi, which containerd applies (its devices are
environment variables; it has no device nodes). Each device's `uuid` attribute is
`gpu-<uuid>`, derived from the node's name; the fake NVML is given the same UUIDs as
NVIDIA spells them (`GPU-<uuid>`, the same hex), by the device's `index` attribute.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.fakes import nvml as fake_nvml
from tests.fakes.nvml import FakeGpu
from tests.k8s import flows
from tests.k8s.node import cluster
from tests.k8s.node.cluster import CDI_DIRS, NODE_NAME, Node

DRIVER = "gpu.example.com"  # the example driver's default name for its gpu profile
CLASS = DRIVER
PROCESS = "dra-example-kubeletplugin"
BUS_IDS = ("0000:5e:00.0", "0000:86:00.0")  # one per device, in index order
# The chart's dra.* values for this driver (it has no MIG devices, nor their class).
VALUES = {"driver": DRIVER, "gpuClass": CLASS, "migClass": "mig.example.com"}


@dataclass(frozen=True)
class DraGpu:
    index: int
    device: str  # the slice's device name (gpu-0)
    published: str  # the driver's uuid attribute (gpu-<uuid>)

    @property
    def uuid(self) -> str:
        """As NVML (the fake, here) names it."""
        return "GPU-" + self.published.removeprefix("gpu-")

    def nvml(self) -> FakeGpu:
        return FakeGpu(self.uuid, BUS_IDS[self.index], self.index)


def device_class(extended_resource: str | None = None) -> dict[str, Any]:
    """The driver's DeviceClass, as its chart installs it (KEP-5004's name optional)."""
    spec: dict[str, Any] = {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]}
    if extended_resource:
        spec["extendedResourceName"] = extended_resource
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": CLASS},
        "spec": spec,
    }


def published_gpus(node: Node) -> list[DraGpu] | None:
    """The driver's devices on this node, from its ResourceSlice, once it has all."""
    found = node.kubectl("get", "resourceslices", "-o", "json", check=False).stdout
    slices = [
        s for s in json.loads(found or '{"items": []}')["items"]
        if s["spec"]["driver"] == DRIVER and s["spec"].get("nodeName") == NODE_NAME
    ]  # fmt: skip
    devices = [d for s in slices for d in s["spec"].get("devices", [])]
    if len(devices) != len(BUS_IDS):
        return None
    gpus = [
        DraGpu(d["attributes"]["index"]["int"], d["name"], d["attributes"]["uuid"]["string"])
        for d in devices
    ]
    return sorted(gpus, key=lambda g: g.index)


def start(node: Node, extended_resource: str | None = None) -> list[DraGpu]:
    """Build (cached) and start the driver, install its DeviceClass; its GPUs, published."""
    binary = cluster.build_dra_driver()
    node.apply(device_class(extended_resource))
    node.start_process(PROCESS, [
        str(binary), "--node-name", NODE_NAME, "--cdi-root", CDI_DIRS[1],
        "--num-devices", str(len(BUS_IDS)), "--kubeconfig", str(node.kubeconfigs["admin"]),
    ])  # fmt: skip
    published: list[DraGpu] = flows.wait_for(
        "the driver's ResourceSlice", lambda: published_gpus(node), 90
    )
    return published


def stop(node: Node) -> None:
    node.kubectl("delete", "resourceclaims", "--all", "-A", "--wait=false", check=False)
    node.stop_process(PROCESS)
    node.kubectl("delete", "deviceclass", CLASS, "--ignore-not-found", check=False)


def write_nvml(path: Path, gpus: Sequence[FakeGpu]) -> None:
    fake_nvml.write_config(path, list(gpus))
