"""Which cgroup hierarchies the host has: v1, v2 (unified) or hybrid.

In hybrid mode (v1 controllers plus cgroup2 at `/sys/fs/cgroup/unified`) the
kernel checks both the v1 `devices` rules and the v2 BPF device programs, so
the engine must satisfy both wherever each one restricts.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from hotmount.errors import KernelError
from hotmount.hostfs import HostRoot


class CgroupMode(StrEnum):
    V1 = "v1"
    V2 = "v2"
    HYBRID = "hybrid"


@dataclass(frozen=True)
class CgroupLayout:
    mode: CgroupMode
    v1_devices_root: Path | None
    v2_root: Path | None

    def v1_dir(self, relative: str | None) -> Path | None:
        return _join(self.v1_devices_root, relative)

    def v2_dir(self, relative: str | None) -> Path | None:
        return _join(self.v2_root, relative)


def _join(root: Path | None, relative: str | None) -> Path | None:
    if root is None or relative is None:
        return None
    return root / relative.lstrip("/") if relative.strip("/") else root


def detect(host: HostRoot) -> CgroupLayout:
    base = host.cgroup_mount
    if (base / "cgroup.controllers").exists():
        return CgroupLayout(CgroupMode.V2, None, base)
    devices = base / "devices"
    unified = base / "unified"
    has_v1 = (devices / "devices.list").exists()
    has_v2 = (unified / "cgroup.controllers").exists()
    if has_v1 and has_v2:
        return CgroupLayout(CgroupMode.HYBRID, devices, unified)
    if has_v1:
        return CgroupLayout(CgroupMode.V1, devices, None)
    raise KernelError(f"no cgroup v2 hierarchy and no v1 devices controller under {base}")
