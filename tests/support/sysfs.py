"""A fixture sysfs: a PCIe tree with GPUs and RDMA NICs, linked the way the kernel links it.

Every link is relative, as in the real `/sys`, so the tree resolves inside its
host root. The layout (GPU bus ids match tests/unit/hosttree.py):

    pci0000:00 (NUMA 0)
      00:01.0 root port -> 01:00.0 switch up -> 02:00.0 -> GPU 0000:18:00.0 (index 0)
                                              -> 02:01.0 -> NIC mlx5_0 0000:19:00.0
      00:02.0 root port -> GPU 0000:3b:00.0 (index 1)            (same host bridge)
    pci0000:40 (NUMA 0)   00:01.0 -> NIC mlx5_2 0000:41:00.0     (decoy: other NUMA for GPU 2)
    pci0000:80 (NUMA 1)   80:01.0 -> GPU 0000:86:00.0 (index 2)
    pci0000:c0 (NUMA 1)   c0:01.0 -> NIC mlx5_1 0000:c1:00.0     (same NUMA as GPU 2)
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

UVERBS_MAJOR = 231
RDMA_CM = (10, 58)


@dataclass(frozen=True)
class FixtureNic:
    name: str
    path: tuple[str, ...]  # host bridge .. the NIC's own bus id
    numa: int
    uverbs: int  # uverbsN; minor 192 + N
    netdev: str
    number: tuple[int, int] | None = None  # default 231:(192 + N); kernel tests pick stand-ins

    @property
    def bus_id(self) -> str:
        return self.path[-1]

    @property
    def dev(self) -> tuple[int, int]:
        return self.number or (UVERBS_MAJOR, 192 + self.uverbs)


GPU_PATHS = {
    "0000:18:00.0": (("pci0000:00", "0000:00:01.0", "0000:01:00.0", "0000:02:00.0"), 0),
    "0000:3b:00.0": (("pci0000:00", "0000:00:02.0"), 0),
    "0000:86:00.0": (("pci0000:80", "0000:80:01.0"), 1),
}
NICS = (
    FixtureNic(
        "mlx5_0",
        ("pci0000:00", "0000:00:01.0", "0000:01:00.0", "0000:02:01.0", "0000:19:00.0"),
        0,
        0,
        "ens1f0",
    ),
    FixtureNic("mlx5_1", ("pci0000:c0", "0000:c0:01.0", "0000:c1:00.0"), 1, 1, "ens2f0"),
    FixtureNic("mlx5_2", ("pci0000:40", "0000:40:01.0", "0000:41:00.0"), 0, 2, "ens3f0"),
)


def _link(root: Path, absolute: str, target_absolute: str) -> None:
    link = root / absolute.lstrip("/")
    link.parent.mkdir(parents=True, exist_ok=True)
    target = root / target_absolute.lstrip("/")
    link.symlink_to(os.path.relpath(target, link.parent))


def pci_device(root: Path, path: tuple[str, ...], numa: int) -> str:
    """Create `/sys/devices/<path>` with its numa_node and bus link; return its sysfs dir."""
    directory = "/sys/devices/" + "/".join(path)
    (root / directory.lstrip("/")).mkdir(parents=True, exist_ok=True)
    (root / directory.lstrip("/") / "numa_node").write_text(f"{numa}\n")
    _link(root, f"/sys/bus/pci/devices/{path[-1]}", directory)
    return directory


def add_nic(root: Path, nic: FixtureNic, *, ibdev_file: bool = True) -> None:
    directory = pci_device(root, nic.path, nic.numa)
    base = root / directory.lstrip("/")
    verbs = base / "infiniband_verbs" / f"uverbs{nic.uverbs}"
    verbs.mkdir(parents=True)
    (verbs / "dev").write_text(f"{nic.dev[0]}:{nic.dev[1]}\n")
    if ibdev_file:
        (verbs / "ibdev").write_text(f"{nic.name}\n")
    (base / "infiniband" / nic.name).mkdir(parents=True)
    _link(root, f"{directory}/infiniband/{nic.name}/device", directory)
    _link(root, f"/sys/class/infiniband/{nic.name}", f"{directory}/infiniband/{nic.name}")
    (base / "net" / nic.netdev).mkdir(parents=True)
    _link(
        root,
        f"/sys/dev/char/{nic.dev[0]}:{nic.dev[1]}",
        f"{directory}/infiniband_verbs/uverbs{nic.uverbs}",
    )


def add_char_device(root: Path, major: int, minor: int, bus_id: str) -> None:
    """`/sys/dev/char/<major>:<minor>` for a device under PCI `bus_id` (a DRM-style node)."""
    device = os.path.realpath(root / f"sys/bus/pci/devices/{bus_id}")
    cls = Path(device) / "char" / f"node{major}_{minor}"
    cls.mkdir(parents=True, exist_ok=True)
    _link(
        root, f"/sys/dev/char/{major}:{minor}", "/" + str(cls.relative_to(os.path.realpath(root)))
    )


def build_sysfs(root: Path, nics: tuple[FixtureNic, ...] = NICS) -> Path:
    for bus_id, (upstream, numa) in GPU_PATHS.items():
        pci_device(root, (*upstream, bus_id), numa)
    for nic in nics:
        add_nic(root, nic)
    rdma_cm = root / "sys/class/misc/rdma_cm"
    rdma_cm.mkdir(parents=True, exist_ok=True)
    (rdma_cm / "dev").write_text(f"{RDMA_CM[0]}:{RDMA_CM[1]}\n")
    return root
