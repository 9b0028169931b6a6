"""NVIDIA GPUs and control nodes: NVML when it loads, else /proc/driver/nvidia.

The index is NVML's (and nvidia-smi's): GPUs ordered by PCI bus id. It is not
the minor number, which names `/dev/nvidia<minor>`; UUID is the canonical key.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hotmount.devices import mig_nvml
from hotmount.devices.model import DeviceNode
from hotmount.hostfs import HostRoot

log = logging.getLogger(__name__)

NVIDIA_MAJOR = 195
NVIDIACTL_MINOR = 255
NVIDIA_MODESET_MINOR = 254


@dataclass(frozen=True)
class GpuInfo:
    index: int
    uuid: str
    pci_bus_id: str
    minor: int
    # Its MIG devices as NVML lists them; None where NVML was not read (procfs) or failed.
    migs: tuple[mig_nvml.NvmlMig, ...] | None = None


def normalize_bus_id(bus_id: str) -> str:
    """`00000000:3B:00.0` (NVML) and `0000:3b:00.0` (procfs) -> `0000:3b:00.0`."""
    bus_id = bus_id.strip().lower()
    domain, _, rest = bus_id.partition(":")
    return f"{int(domain, 16):04x}:{rest}" if rest else bus_id


def parse_information(text: str) -> tuple[str, str, int]:
    """Parse `/proc/driver/nvidia/gpus/<pci>/information` into (uuid, bus id, minor)."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            fields[key.strip()] = value.strip()
    try:
        return (
            fields["GPU UUID"],
            normalize_bus_id(fields["Bus Location"]),
            int(fields["Device Minor"]),
        )
    except (KeyError, ValueError) as exc:
        raise ValueError(f"unreadable GPU information file: missing or bad {exc}") from exc


def gpus_from_procfs(host: HostRoot) -> list[GpuInfo]:
    found = []
    for info in sorted(host.path("/proc/driver/nvidia/gpus").glob("*/information")):
        try:
            found.append(parse_information(info.read_text()))
        except (OSError, ValueError) as exc:
            log.warning("skipping %s: %s", info, exc)
    found.sort(key=lambda item: item[1])
    return [GpuInfo(i, uuid, bus, minor) for i, (uuid, bus, minor) in enumerate(found)]


def gpus_from_nvml() -> list[GpuInfo] | None:
    """GPUs as NVML enumerates them, or None when NVML cannot be loaded."""
    try:
        import pynvml  # nvidia-ml-py: optional
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        log.info("NVML unavailable (%s); reading /proc/driver/nvidia", exc)
        return None
    try:
        gpus = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            uuid = _text(pynvml.nvmlDeviceGetUUID(handle))
            bus = normalize_bus_id(_text(pynvml.nvmlDeviceGetPciInfo(handle).busId))
            minor = pynvml.nvmlDeviceGetMinorNumber(handle)
            gpus.append(GpuInfo(index, uuid, bus, minor, _migs(pynvml, handle, uuid, minor)))
        return gpus
    except pynvml.NVMLError as exc:
        log.warning("NVML enumeration failed (%s); reading /proc/driver/nvidia", exc)
        return None
    finally:
        pynvml.nvmlShutdown()


def _migs(pynvml: Any, handle: Any, uuid: str, minor: int) -> tuple[mig_nvml.NvmlMig, ...] | None:
    """One GPU's MIG devices; None if NVML fails on them (its instances then come from
    /proc alone, without UUIDs, rather than the GPU going missing)."""
    try:
        return tuple(mig_nvml.read_migs(pynvml, handle, minor))
    except pynvml.NVMLError as exc:
        log.warning("NVML cannot list the MIG devices of %s (%s); reading /proc", uuid, exc)
        return None


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


_PROC_DEVICES_LINE = re.compile(r"^\s*(\d+)\s+(\S+)\s*$")


def char_majors(host: HostRoot) -> dict[str, int]:
    """Character device majors by driver name, from `/proc/devices`."""
    try:
        text = host.path("/proc/devices").read_text()
    except OSError:
        return {}
    return parse_proc_devices(text)


def parse_proc_devices(text: str) -> dict[str, int]:
    majors: dict[str, int] = {}
    in_char = False
    for line in text.splitlines():
        if line.startswith("Character devices"):
            in_char = True
        elif line.startswith("Block devices"):
            in_char = False
        elif in_char and (match := _PROC_DEVICES_LINE.match(line)):
            majors.setdefault(match.group(2), int(match.group(1)))
    return majors


def control_nodes(host: HostRoot, majors: dict[str, int]) -> tuple[DeviceNode, ...]:
    """The nodes every CUDA program needs besides its GPU's own."""
    nodes = [DeviceNode("/dev/nvidiactl", NVIDIA_MAJOR, NVIDIACTL_MINOR)]
    if "nvidia-uvm" in majors:
        uvm = majors["nvidia-uvm"]
        nodes.append(DeviceNode("/dev/nvidia-uvm", uvm, 0))
        nodes.append(DeviceNode("/dev/nvidia-uvm-tools", uvm, 1))
    if Path(host.path("/dev/nvidia-modeset")).exists() or "nvidia-modeset" in majors:
        nodes.append(DeviceNode("/dev/nvidia-modeset", NVIDIA_MAJOR, NVIDIA_MODESET_MINOR))
    return tuple(nodes)


def gpu_node(minor: int) -> DeviceNode:
    return DeviceNode(f"/dev/nvidia{minor}", NVIDIA_MAJOR, minor)
