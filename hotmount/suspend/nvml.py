"""What NVML says of the GPUs a suspension takes: each process's used GPU memory (what
its checkpoint copies into host memory) and each GPU's model name."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GpuView:
    processes: dict[int, int]  # host PID -> bytes of GPU memory, over the GPUs asked about
    models: dict[str, str]  # UUID -> NVML's name


def look(uuids: list[str]) -> GpuView | None:
    """None where NVML does not load: then no memory check can be made."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return None
    processes: dict[int, int] = {}
    models: dict[str, str] = {}
    try:
        for uuid in uuids:
            try:
                handle = pynvml.nvmlDeviceGetHandleByUUID(uuid)
            except pynvml.NVMLError:
                continue
            name = pynvml.nvmlDeviceGetName(handle)
            models[uuid] = name.decode() if isinstance(name, bytes) else name
            for getter in (
                pynvml.nvmlDeviceGetComputeRunningProcesses,
                pynvml.nvmlDeviceGetGraphicsRunningProcesses,
            ):
                for info in getter(handle):
                    used = info.usedGpuMemory or 0  # None where the driver will not say
                    processes[info.pid] = processes.get(info.pid, 0) + used
    finally:
        pynvml.nvmlShutdown()
    return GpuView(processes, models)
