"""MIG devices as NVML enumerates them: UUIDs, GPU and compute instance IDs, profile, memory.

/proc/driver/nvidia-caps gives the capability nodes a MIG instance needs, but no UUID;
NVML gives the UUID (what the device plugin, DRA and CUDA_VISIBLE_DEVICES name it by)
but no nodes. The inventory joins the two on (parent minor, GI, CI): see `join`.

The calls are nvml.h's, through pynvml: `nvmlDeviceGetMigMode` on the parent, then every
index below `nvmlDeviceGetMaxMigDeviceCount` (which counts *possible* devices: an index
with none answers NVML_ERROR_NOT_FOUND and is skipped, so holes are normal).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from hotmount.devices.mig import MigInstance

log = logging.getLogger(__name__)

# What the inventory accepts as a name (inventory._UUID): anything else NVML says is dropped.
_MIG_UUID = re.compile(r"^MIG-[A-Za-z0-9-]{1,120}$")
_PROFILE = re.compile(r"\bMIG\s+(\d+c\.)?\d+g\.\d+gb(\+[a-z]+)?$")


@dataclass(frozen=True)
class NvmlMig:
    gpu_minor: int  # the parent GPU's /dev/nvidia<minor>
    gi: int
    ci: int
    uuid: str
    profile: str | None
    memory_mib: int | None

    @property
    def place(self) -> tuple[int, int, int]:
        return (self.gpu_minor, self.gi, self.ci)


def profile_from_name(name: str) -> str | None:
    """The driver names a MIG device `<GPU name> MIG <profile>` (`NVIDIA A100-SXM4-40GB
    MIG 1g.5gb`, `... MIG 1c.2g.20gb`, `... MIG 1g.10gb+me`); the profile, or None."""
    match = _PROFILE.search(name.strip())
    return match.group(0).split()[-1] if match else None


def read_migs(pynvml: Any, gpu: Any, gpu_minor: int) -> list[NvmlMig]:
    """The MIG devices NVML lists under the GPU handle `gpu`; none where MIG is off or
    unsupported. Other NVML errors propagate: the caller falls back to /proc."""
    try:
        current, _pending = pynvml.nvmlDeviceGetMigMode(gpu)
    except pynvml.NVMLError_NotSupported:
        return []
    if current != pynvml.NVML_DEVICE_MIG_ENABLE:
        return []
    found = []
    for index in range(pynvml.nvmlDeviceGetMaxMigDeviceCount(gpu)):
        try:
            handle = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(gpu, index)
        except pynvml.NVMLError_NotFound:
            continue
        uuid = _text(pynvml.nvmlDeviceGetUUID(handle))
        if not _MIG_UUID.match(uuid):
            log.warning("NVML names a MIG device %r: not a MIG UUID, ignored", uuid)
            continue
        found.append(
            NvmlMig(
                gpu_minor=gpu_minor,
                gi=pynvml.nvmlDeviceGetGpuInstanceId(handle),
                ci=pynvml.nvmlDeviceGetComputeInstanceId(handle),
                uuid=uuid,
                profile=profile_from_name(_text(pynvml.nvmlDeviceGetName(handle))),
                memory_mib=int(pynvml.nvmlDeviceGetAttributes_v2(handle).memorySizeMB),
            )
        )
    return found


def join(
    instances: Iterable[MigInstance], listed: Iterable[NvmlMig] | None
) -> list[tuple[MigInstance, NvmlMig | None]]:
    """Each /proc instance with what NVML says of it (None where NVML did not list it).

    Only /proc's instances come out: a device NVML lists without capability nodes has
    nothing to mount. `listed` None: NVML was not read at all.
    """
    by_place = {m.place: m for m in listed or ()}
    pairs = []
    for instance in instances:
        pairs.append((instance, by_place.pop((instance.gpu_minor, instance.gi, instance.ci), None)))
    for orphan in by_place.values():
        log.warning(
            "NVML lists MIG device %s (GPU minor %d, GI %d, CI %d) but the driver has no "
            "capability nodes for it: it cannot be mounted",
            orphan.uuid,
            *orphan.place,
        )
    return pairs


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value
