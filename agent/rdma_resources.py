"""What the kubelet's RDMA allocations hold, by the device IDs real plugins emit. Pure.

Two plugins give pods RDMA NICs, and their IDs mean different things:

- The SR-IOV network device plugin (k8snetworkplumbingwg/sriov-network-device-plugin)
  advertises every device of a pool by its PCI address, `0000:3b:00.2`: a VF's, or a
  PF's where the pool's selectors pick PFs. The ID is the function, so it maps to the
  verbs device of that function (`Inventory.pci_device`). Pools the operator names in
  `--rdma-resource` must map in full: an ID that names no RDMA device of the inventory
  could be any of them, so every RDMA mount is refused until it maps (fail closed).
  Other resources' IDs map as before where they can and are skipped where they cannot
  (a hugepages or CPU-pinning plugin cannot block a GPU mount).
- The RDMA shared device plugin (Mellanox/k8s-rdma-shared-dev-plugin) advertises
  `rdmaHcaMax` interchangeable IDs, `"0"` to `"N-1"` (pkg/resources/server.go:
  `strconv.Itoa(n)`), for a resource whose HCAs its config picks (`devices`, or
  `selectors`: vendors, deviceIDs, drivers, ifNames, linkTypes), and gives every pod
  that asks the RDMA nodes of all those HCAs at once. The IDs name no device (and would
  read as GPU indexes), so an operator names the resource in `--rdma-shared-resource
  NAME=DEV,...` with the HCAs it covers (`rdma/mlx5_0`, a PCI address, or an interface
  name as in `ifNames`); none named, or one that does not resolve: every RDMA device of
  the node. Sharing means the resource as a whole holds its HCAs: they go only to pods
  the kubelet gave that resource (which have them already), never to another tenant.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from hotmount.api import Device, Inventory, is_rdma

_RESOURCE = re.compile(
    r"^[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?/[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?$"
)
_DEVICE = re.compile(r"^[A-Za-z0-9_.:/-]{1,72}$")


@dataclass(frozen=True)
class SharedResource:
    """One shared-plugin resource and the HCAs it covers (empty: every RDMA device)."""

    name: str
    devices: tuple[str, ...] = ()


def check_resource(name: str) -> str:
    """An extended resource name (`vendor/name`), or ValueError."""
    if not _RESOURCE.match(name):
        raise ValueError(f"{name!r} is not a resource name (vendor.example/name)")
    return name


def parse_shared(value: str) -> SharedResource:
    """`NAME` or `NAME=DEV,DEV`: checked when the agent starts, resolved at each check
    (an HCA named here that the inventory lacks widens the resource to every one)."""
    name, sep, rest = value.partition("=")
    devices = tuple(d.strip() for d in rest.split(",")) if sep else ()
    if sep and (not devices or not all(_DEVICE.match(d) for d in devices)):
        raise ValueError(
            f"{value!r}: expected RESOURCE or RESOURCE=DEV,... where DEV is rdma/<name>, "
            "a PCI address or an interface name"
        )
    return SharedResource(check_resource(name.strip()), devices)


def covered(shared: SharedResource, inventory: Inventory) -> list[Device]:
    """The RDMA devices a shared resource gives its pods; every one where it names none
    or names one the inventory does not have (what it gives cannot be told: fail closed)."""
    every = inventory.rdma_devices()
    found: dict[str, Device] = {}
    for ref in shared.devices:
        device = _rdma_by_any_name(ref, inventory, every)
        if device is None:
            return every
        found.setdefault(device.key, device)
    return list(found.values()) if found else every


def rdma_device(device_id: str, inventory: Inventory) -> Device | None:
    """The RDMA device an `--rdma-resource` ID names (a PCI address, or an inventory
    name of an RDMA device), else None: never a GPU, whatever the ID looks like."""
    device = inventory.pci_device(device_id) or inventory.get(device_id)
    return device if device is not None and is_rdma(device) else None


def _rdma_by_any_name(ref: str, inventory: Inventory, every: list[Device]) -> Device | None:
    device = rdma_device(ref, inventory)
    if device is not None:
        return device
    return next((d for d in every if ref in d.netdevs), None)
