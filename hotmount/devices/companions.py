"""RDMA devices that ride along with GPUs: which to add, and when they leave. Pure.

`withRdma` adds the NIC nearest each GPU of a mount (hotmount/devices/topology.py); a
request may also name RDMA devices. Either way they are mounted in the same
operation as the GPUs (one plan, one rollback), and the ledger notes which
devices each came `with`, so unmounting the last of those GPUs takes the NIC
too. An RDMA device mounted on its own has no `with` and stays until named.
"""

from __future__ import annotations

from collections.abc import Iterable

from hotmount.devices import rdma
from hotmount.devices.inventory import Inventory
from hotmount.devices.model import Device
from hotmount.errors import InvalidDeviceRef
from hotmount.state.ledger import ContainerRecord


def rdma_for(
    inventory: Inventory, devices: list[Device], with_rdma: bool, named: Iterable[str] = ()
) -> dict[str, tuple[Device, list[str]]]:
    """RDMA key -> (device, the GPUs it comes with): each GPU's nearest NIC comes with that
    GPU, a named one with every GPU of the request. Everything is resolved before anything
    is touched; a named one must be RDMA."""
    gpus = [d for d in devices if not rdma.is_rdma(d)]
    every = [g.key for g in gpus]
    out: dict[str, tuple[Device, list[str]]] = {}
    for ref in named:
        device = inventory.resolve(ref)
        if not rdma.is_rdma(device):
            raise InvalidDeviceRef(f"{ref!r} is not an RDMA device ({device.kind})")
        out.setdefault(device.key, (device, every))
    if with_rdma:
        if not gpus:
            raise InvalidDeviceRef("withRdma adds the NIC nearest a GPU: name a GPU too")
        for gpu in gpus:
            nic = inventory.nearest_rdma(gpu)
            _, along = out.setdefault(nic.key, (nic, []))
            if gpu.key not in along:
                along.append(gpu.key)
    named_keys = {d.key for d in devices}
    return {k: v for k, v in out.items() if k not in named_keys}


def note(record: ContainerRecord, riders: dict[str, tuple[Device, list[str]]]) -> None:
    """Riders the record holds already: add the GPUs they now also come with, but only
    where they came with a GPU before (one mounted on its own stays so)."""
    for key, (_, gpus) in riders.items():
        entry = record.devices.get(key)
        if entry is None or not entry.with_devices:
            continue
        entry.with_devices = list(dict.fromkeys([*entry.with_devices, *gpus]))


def leaving_with(record: ContainerRecord, keys: list[str]) -> list[str]:
    """`keys` plus every device that came with them and has none of its GPUs left."""
    going = set(keys)
    extra = [
        key
        for key, entry in record.devices.items()
        if key not in going
        and entry.with_devices
        and all(g in going or g not in record.devices for g in entry.with_devices)
    ]
    return [*keys, *extra]
