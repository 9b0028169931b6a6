"""RDMA devices (InfiniBand/RoCE verbs) from sysfs, read through the host root.

Each verbs device (`/sys/class/infiniband/mlx5_0`) gives a container one
`/dev/infiniband/uverbsN` (its major:minor from sysfs `dev`, never guessed) plus
`/dev/infiniband/rdma_cm`, which every RDMA program opens and no device owns
(a shared node, like `nvidiactl`). The device's PCI place and NUMA node feed the
nearest-NIC rule (hotmount/devices/topology.py); its network interfaces are listed so
that `withNetdev` can pick the NIC's own.
"""

from __future__ import annotations

import logging
import os
import re
import stat
from dataclasses import dataclass

from hotmount.devices.model import Device, DeviceKind, DeviceNode
from hotmount.devices.topology import PciLocation, pci_path, read_numa
from hotmount.hostfs import HostRoot

log = logging.getLogger(__name__)

RDMA_PREFIX = "rdma/"
RDMA_NODE_DIR = "/dev/infiniband/"
RDMA_CM_PATH = "/dev/infiniband/rdma_cm"
_DEV = re.compile(r"^(\d+):(\d+)$")
_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


@dataclass(frozen=True)
class RdmaNic:
    name: str  # the verbs device: mlx5_0
    uverbs: str  # its char device: uverbs0
    major: int
    minor: int
    location: PciLocation | None
    netdevs: tuple[str, ...]


def parse_dev(text: str) -> tuple[int, int]:
    match = _DEV.match(text.strip())
    if match is None:
        raise ValueError(f"not a major:minor: {text.strip()!r}")
    return int(match.group(1)), int(match.group(2))


def nics(host: HostRoot) -> list[RdmaNic]:
    """Every verbs device sysfs lists, with its uverbs node; unreadable ones are skipped."""
    found = []
    base = host.path("/sys/class/infiniband")
    if not base.is_dir():
        return []
    for entry in sorted(os.listdir(base)):
        if not _NAME.match(entry):
            continue
        try:
            nic = _nic(host, entry)
        except (OSError, ValueError) as exc:
            log.warning("skipping RDMA device %s: %s", entry, exc)
            continue
        if nic is not None:
            found.append(nic)
    return found


def _nic(host: HostRoot, name: str) -> RdmaNic | None:
    device_dir = f"/sys/class/infiniband/{name}/device"
    verbs_dir = host.path(f"{device_dir}/infiniband_verbs")
    if not verbs_dir.is_dir():
        log.info("RDMA device %s has no uverbs device: not mountable", name)
        return None
    chosen = None
    candidates = sorted(p for p in verbs_dir.iterdir() if p.name.startswith("uverbs"))
    for uverbs in candidates:
        ibdev = uverbs / "ibdev"
        if not ibdev.exists() or ibdev.read_text().strip() == name:
            chosen = uverbs
            if ibdev.exists():
                break
    if chosen is None:
        return None
    major, minor = parse_dev((chosen / "dev").read_text())
    resolved = os.path.realpath(host.path(device_dir))
    path = pci_path(resolved)
    location = PciLocation(path[-1], path, read_numa(host, device_dir)) if len(path) >= 2 else None
    net_dir = host.path(f"{device_dir}/net")
    netdevs = tuple(sorted(os.listdir(net_dir))) if net_dir.is_dir() else ()
    return RdmaNic(name, chosen.name, major, minor, location, netdevs)


def rdma_cm_node(host: HostRoot) -> DeviceNode | None:
    """`/dev/infiniband/rdma_cm` (a misc device, dynamic minor): from sysfs, else the node."""
    try:
        major, minor = parse_dev(host.path("/sys/class/misc/rdma_cm/dev").read_text())
        return DeviceNode(RDMA_CM_PATH, major, minor)
    except (OSError, ValueError):
        pass
    try:
        st = os.stat(host.path(RDMA_CM_PATH))
    except OSError:
        return None
    if not stat.S_ISCHR(st.st_mode):
        return None
    return DeviceNode(RDMA_CM_PATH, os.major(st.st_rdev), os.minor(st.st_rdev))


def device(nic: RdmaNic, rdma_cm: DeviceNode | None) -> Device:
    return Device(
        key=f"{RDMA_PREFIX}{nic.name}",
        kind=DeviceKind.RDMA,
        nodes=(DeviceNode(f"{RDMA_NODE_DIR}{nic.uverbs}", nic.major, nic.minor),),
        shared_nodes=(rdma_cm,) if rdma_cm is not None else (),
        pci_bus_id=nic.location.bus_id if nic.location else None,
        minor=nic.minor,
        aliases=(f"{RDMA_PREFIX}{nic.uverbs}",),
        numa_node=nic.location.numa_node if nic.location else None,
        netdevs=nic.netdevs,
    )


def is_rdma(dev: Device) -> bool:
    """An RDMA device: found in sysfs, or a CDI device whose nodes are verbs nodes."""
    return dev.kind is DeviceKind.RDMA or any(
        n.path.startswith(RDMA_NODE_DIR) and n.path != RDMA_CM_PATH for n in dev.nodes
    )
