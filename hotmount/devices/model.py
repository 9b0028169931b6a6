"""The device model: what a device is, which nodes it needs, and the rules granting them.

Pure data: no I/O. A `Device` is one thing a caller can name (a GPU, a MIG
instance, a CDI device); its `nodes` are its own, its `shared_nodes` are
reference-counted across the devices of one container (`nvidiactl` and the UVM
nodes come with the first GPU and go with the last).
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass, field
from enum import StrEnum
from functools import cached_property


class DeviceKind(StrEnum):
    GPU = "gpu"
    MIG = "mig"
    CDI = "cdi"
    RDMA = "rdma"


# Access bits, as in the kernel's BPF_DEVCG_ACC_* and the v1 "rwm" letters.
ACCESS_MKNOD = 1
ACCESS_READ = 2
ACCESS_WRITE = 4
_ACCESS_LETTERS = {"m": ACCESS_MKNOD, "r": ACCESS_READ, "w": ACCESS_WRITE}


def access_mask(letters: str) -> int:
    """`"rw"` -> READ|WRITE; refuses anything but r, w and m."""
    mask = 0
    for letter in letters:
        if letter not in _ACCESS_LETTERS:
            raise ValueError(f"device permissions {letters!r}: only r, w and m are allowed")
        mask |= _ACCESS_LETTERS[letter]
    return mask


def access_letters(mask: int) -> str:
    return "".join(letter for letter, bit in (("r", 2), ("w", 4), ("m", 1)) if mask & bit)


@dataclass(frozen=True, order=True)
class DeviceNode:
    """A character device node as it appears inside the container."""

    path: str
    major: int
    minor: int
    file_mode: int = 0o666
    permissions: str = "rw"

    def __post_init__(self) -> None:
        # Normalised, so one node has one spelling (shared-node bookkeeping is by path).
        if not self.path.startswith("/dev/") or posixpath.normpath(self.path) != self.path:
            raise ValueError(f"device node path {self.path!r} must be a plain path under /dev/")
        if not (0 <= self.major < 4096 and 0 <= self.minor < 1 << 20):
            raise ValueError(f"device number {self.major}:{self.minor} is out of range")
        access_mask(self.permissions)

    @cached_property
    def rule(self) -> DeviceRule:
        return DeviceRule("c", self.major, self.minor, access_mask(self.permissions))

    def as_dict(self) -> dict[str, object]:
        return {
            "path": self.path,
            "major": self.major,
            "minor": self.minor,
            "fileMode": f"{self.file_mode:04o}",
            "permissions": self.permissions,
        }


@dataclass(frozen=True, order=True)
class DeviceRule:
    """One grant: a character device and the access allowed to it."""

    type: str
    major: int
    minor: int
    access: int

    def v1_line(self) -> str:
        return f"{self.type} {self.major}:{self.minor} {access_letters(self.access)}"


@dataclass(frozen=True)
class MigDetails:
    """What a MIG instance is. `source` says where it was read: `nvml` (with its UUID,
    profile and memory) or `procfs` (/proc/driver/nvidia-caps alone: IDs, no UUID)."""

    gpu_instance: int
    compute_instance: int
    source: str = "procfs"
    profile: str | None = None  # e.g. 1g.10gb
    memory_mib: int | None = None

    def as_dict(self) -> dict[str, object]:
        return {
            "gpuInstance": self.gpu_instance,
            "computeInstance": self.compute_instance,
            "source": self.source,
            "profile": self.profile,
            "memoryMiB": self.memory_mib,
        }


@dataclass(frozen=True)
class Device:
    """A device a caller can name: the key is canonical (UUID or CDI name)."""

    key: str
    kind: DeviceKind
    nodes: tuple[DeviceNode, ...]
    shared_nodes: tuple[DeviceNode, ...] = ()
    index: int | None = None
    uuid: str | None = None
    pci_bus_id: str | None = None
    minor: int | None = None
    parent: str | None = None
    aliases: tuple[str, ...] = field(default=())
    numa_node: int | None = None
    netdevs: tuple[str, ...] = ()  # an RDMA NIC's network interfaces
    mig: MigDetails | None = None  # a MIG instance's IDs, profile and memory

    @property
    def all_nodes(self) -> tuple[DeviceNode, ...]:
        return self.nodes + self.shared_nodes

    def as_dict(self) -> dict[str, object]:
        return {
            "key": self.key,
            "kind": str(self.kind),
            "index": self.index,
            "uuid": self.uuid,
            "pciBusId": self.pci_bus_id,
            "minor": self.minor,
            "parent": self.parent,
            "aliases": list(self.aliases),
            "numaNode": self.numa_node,
            "netdevs": list(self.netdevs),
            "mig": self.mig.as_dict() if self.mig else None,
            "nodes": [n.as_dict() for n in self.nodes],
            "sharedNodes": [n.as_dict() for n in self.shared_nodes],
        }
