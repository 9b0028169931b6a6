"""PCIe topology: where a device sits, and which RDMA NIC is nearest a GPU.

GPUDirect RDMA is only fast when the NIC and the GPU talk through as little of
the machine as possible. The rule is NCCL's (and `nvidia-smi topo -m`'s):

1. the same PCIe switch (PIX/PXB): the two devices share a bridge below the
   host bridge; the longer their common path, the closer;
2. the same host bridge (PHB);
3. the same NUMA node (NODE);
4. anything else (SYS).

Ties go to the NIC whose name sorts first, so the choice is stable. The pure
part (`distance`, `nearest`) works on `PciLocation`s; `locate` and
`char_device_location` read them from sysfs through a `HostRoot`.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import IntEnum

from hotmount.hostfs import HostRoot

_PCI_ADDRESS = re.compile(r"^[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
_HOST_BRIDGE = re.compile(r"^pci[0-9a-f]{4,8}:[0-9a-f]{2}$")


def pci_address(text: str) -> str | None:
    """`text` as a canonical PCI address (`0000:3b:00.2`), or None if it is not one.

    NVML writes an 8-digit domain (`00000000:3B:00.0`), sysfs and the SR-IOV network
    device plugin a 4-digit one (`0000:3b:00.2`): both name the same function.
    """
    lowered = text.strip().lower()
    if not _PCI_ADDRESS.match(lowered):
        return None
    domain, _, rest = lowered.partition(":")
    return f"{int(domain, 16):04x}:{rest}"


class Level(IntEnum):
    """How far apart two devices are: lower is nearer."""

    PCIE_SWITCH = 0
    HOST_BRIDGE = 1
    NUMA_NODE = 2
    SYSTEM = 3


@dataclass(frozen=True)
class PciLocation:
    """`path`: the host bridge, every bridge below it, then the device itself."""

    bus_id: str
    path: tuple[str, ...]
    numa_node: int | None = None

    @property
    def upstream(self) -> tuple[str, ...]:
        return self.path[:-1]


def pci_path(resolved: str) -> tuple[str, ...]:
    """The PCI part of a resolved sysfs path: `/sys/devices/pci0000:00/0000:00:01.0/...`."""
    parts = [p for p in resolved.split("/") if p]
    out: list[str] = []
    for part in parts:
        if _HOST_BRIDGE.match(part):
            out = [part]
        elif out and _PCI_ADDRESS.match(part):
            out.append(part)
        elif out:
            break  # past the PCI device (`infiniband_verbs/uverbs0`, `net/eth0`)
    return tuple(out)


def _common(a: tuple[str, ...], b: tuple[str, ...]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def distance(a: PciLocation, b: PciLocation) -> tuple[Level, int]:
    """(level, -shared bridges): sorts nearest first."""
    common = _common(a.upstream, b.upstream)
    if common >= 2:  # the host bridge and at least one bridge below it
        return Level.PCIE_SWITCH, -common
    if common == 1:
        return Level.HOST_BRIDGE, -common
    if a.numa_node is not None and a.numa_node >= 0 and a.numa_node == b.numa_node:
        return Level.NUMA_NODE, 0
    return Level.SYSTEM, 0


def nearest(target: PciLocation, candidates: Mapping[str, PciLocation]) -> str | None:
    """The candidate (by name) nearest `target`, by the module's rule; None if none."""
    if not candidates:
        return None
    return min(candidates, key=lambda name: (*distance(target, candidates[name]), name))


def ranked(target: PciLocation, candidates: Mapping[str, PciLocation]) -> list[str]:
    return sorted(candidates, key=lambda name: (*distance(target, candidates[name]), name))


def nearest_of_each(
    targets: Mapping[str, PciLocation], candidates: Mapping[str, PciLocation]
) -> dict[str, list[str]]:
    """Candidate name -> the targets whose nearest candidate it is (`nvcli list`)."""
    out: dict[str, list[str]] = {name: [] for name in candidates}
    for target_name, location in targets.items():
        chosen = nearest(location, candidates)
        if chosen is not None:
            out[chosen].append(target_name)
    return out


# -- sysfs


def _resolve(host: HostRoot, absolute: str) -> str | None:
    """Resolve a sysfs link under the host root; relative links (as sysfs has) stay in it."""
    path = host.path(absolute)
    if not os.path.lexists(path):
        return None
    resolved = os.path.realpath(path)
    root = os.path.realpath(host.root)
    if root != "/" and not resolved.startswith(root + "/"):
        return None
    return resolved


def read_numa(host: HostRoot, device_dir: str) -> int | None:
    try:
        value = int(host.path(f"{device_dir}/numa_node").read_text().strip())
    except (OSError, ValueError):
        return None
    return value if value >= 0 else None


def locate(host: HostRoot, bus_id: str) -> PciLocation | None:
    """A PCI device's place in the tree, from `/sys/bus/pci/devices/<bus id>`."""
    device_dir = f"/sys/bus/pci/devices/{bus_id}"
    resolved = _resolve(host, device_dir)
    if resolved is None:
        return None
    path = pci_path(resolved)
    if not path or path[-1] != bus_id:
        return None
    return PciLocation(bus_id, path, read_numa(host, device_dir))


def char_device_location(host: HostRoot, major: int, minor: int) -> PciLocation | None:
    """The PCI device behind a character device, from `/sys/dev/char/<major>:<minor>`
    (uverbs, DRM render nodes; any driver that registers its class device)."""
    resolved = _resolve(host, f"/sys/dev/char/{major}:{minor}")
    if resolved is None:
        return None
    path = pci_path(resolved)
    return locate(host, path[-1]) if len(path) >= 2 else None
