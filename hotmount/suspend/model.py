"""What a suspend or resume answers, and which devices are GPUs to it."""

from __future__ import annotations

from dataclasses import dataclass, field

from hotmount.devices.model import Device, DeviceKind
from hotmount.state.ledger import CudaProcess

# A process in a result: {"pid": host PID, "containerPid": its PID in the container's
# PID namespace or None, "gpuBytes": its GPU memory}. The agent tells tenants the
# container's PID only (agent/suspend/suspending.py).
Listed = dict[str, int | None]


@dataclass
class SuspendResult:
    container: dict[str, object]
    devices: list[str]
    processes: list[Listed] = field(default_factory=list)

    def as_dict(self) -> dict[str, object]:
        moved = sum(p["gpuBytes"] or 0 for p in self.processes)
        return {
            "container": self.container,
            "suspended": self.devices,
            "processes": self.processes,
            "hostBytes": moved,
        }


@dataclass
class ResumeResult:
    container: dict[str, object]
    onto: dict[str, str]  # old key -> the key it resumed onto
    processes: list[Listed] = field(default_factory=list)

    def as_dict(self) -> dict[str, object]:
        return {"container": self.container, "resumed": self.onto, "processes": self.processes}


def gpu_uuid(device: Device) -> str | None:
    """The GPU's UUID: NVML's, or a CDI name that is one (`nvidia.com/gpu=GPU-<uuid>`)."""
    if device.uuid:
        return device.uuid
    name = device.key.rpartition("=")[2]
    return name if device.kind is DeviceKind.CDI and name.startswith("GPU-") else None


def listing(processes: list[CudaProcess]) -> list[Listed]:
    return [
        {"pid": p.pid, "containerPid": p.container_pid, "gpuBytes": p.gpu_bytes} for p in processes
    ]
