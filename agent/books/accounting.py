"""Whose books each GPU is in: a device plugin's, DRA's, or nobody's but ours.

A mount by name is complete only when the scheduler's books agree, and how to make
them agree depends on who hands the GPU out (docs/api.md, "Accounting"): a pin pod
for a device plugin's GPU, a ResourceClaim for a DRA driver's, nothing for a GPU
no one else manages. The kubelet's own word is used where it gives one
(PodResources `GetAllocatableResources`, the node's ResourceSlices); a 1.20 kubelet
has no `GetAllocatableResources`, and then a non-zero node allocatable means the
plugin manages every GPU that no slice lists (it cannot say which).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from enum import StrEnum

from agent.books.dra import DraNames, SliceDevice, slice_devices
from agent.config import AgentSettings
from agent.errors import ApiError, UpstreamError
from agent.kube.client import KubeClient
from agent.kube.dra import ResourceApi
from agent.podresources import PodResourcesClient, PodResourcesError
from hotmount.api import Device, DeviceKind, Engine, gpu_uuid

log = logging.getLogger(__name__)

GPU_KINDS = (DeviceKind.GPU, DeviceKind.MIG)


class Management(StrEnum):
    DEVICE_PLUGIN = "device-plugin"
    DRA = "dra"
    UNMANAGED = "unmanaged"


# When a name covers GPUs of different cases (a CDI name for several), the strictest wins.
_STRICTNESS = (Management.DRA, Management.DEVICE_PLUGIN, Management.UNMANAGED)


@dataclass(frozen=True)
class Books:
    """One look at the node: each GPU's case, and the DRA devices by UUID."""

    cases: dict[str, Management]  # inventory key of each GPU and MIG device
    slices: dict[str, SliceDevice]  # GPU or MIG UUID, casefolded, to the slice device

    def published_uuid(self, uuid: str) -> str:
        """``uuid`` spelled as the DRA driver publishes it (a claim's selector compares
        strings; NVML says GPU-, a driver may say gpu-)."""
        found = self.slices.get(uuid.casefold())
        return found.uuid if found is not None and found.uuid else uuid


RECENT_BOOKS_AGE = 10.0  # seconds


@dataclass
class _Recent:
    lock: threading.Lock = field(default_factory=threading.Lock)
    books: Books | None = None
    read_at: float = 0.0


@dataclass(frozen=True)
class Accounting:
    settings: AgentSettings
    engine: Engine
    kube: KubeClient | None
    podresources: PodResourcesClient | None
    resources: ResourceApi | None
    _recent: _Recent = field(default_factory=_Recent, compare=False, repr=False)

    def recent_books(self) -> Books:
        """`books(strict=False)` as read at most RECENT_BOOKS_AGE ago: what an agent shows
        another agent's list, so that a list across 500 nodes is not 500 reads of
        ResourceSlices and nodes at the API server."""
        with self._recent.lock:
            now = time.monotonic()
            if self._recent.books is None or now - self._recent.read_at > RECENT_BOOKS_AGE:
                self._recent.books, self._recent.read_at = self.books(strict=False), now
            return self._recent.books

    def books(self, strict: bool = True) -> Books:
        """Each GPU's case. `strict`: a kubelet or API server that cannot answer is an
        error (a mount must not guess "unmanaged" and skip its pin); otherwise what
        could not be read counts as unmanaged (a listing shows what it knows)."""
        gpus = [d for d in self.engine.inventory.devices if is_gpu(d)]
        cases = dict.fromkeys((d.key for d in gpus), Management.UNMANAGED)
        node = self.settings.node_name
        if self.kube is None or not node:
            return Books(cases, {})
        slices = self._slices(node, strict)
        for device in gpus:
            if _uuids(device, self.engine) & slices.keys():
                cases[device.key] = Management.DRA
        for key in self._plugin_managed(gpus, node, strict):
            if cases[key] is Management.UNMANAGED:
                cases[key] = Management.DEVICE_PLUGIN
        return Books(cases, slices)

    def case(self, device: Device, books: Books) -> Management:
        """The case of any device a caller can name: a CDI name takes its GPUs'."""
        if device.key in books.cases:
            return books.cases[device.key]
        footprint = self.engine.inventory.footprint(device)
        found = {
            books.cases[d.key]
            for d in self.engine.inventory.overlapping(footprint)
            if d.key in books.cases
        }
        return next((c for c in _STRICTNESS if c in found), Management.UNMANAGED)

    def _slices(self, node: str, strict: bool) -> dict[str, SliceDevice]:
        if self.resources is None:
            return {}
        try:
            names = DraNames.of(self.settings)
            listed = slice_devices(self.resources.node_slices(node), node, names)
        except ApiError as exc:
            if strict:
                raise UpstreamError(
                    f"cannot read this node's ResourceSlices: {exc.message}"
                ) from exc
            log.warning("cannot read ResourceSlices: %s", exc.message)
            return {}
        return {s.uuid.casefold(): s for s in listed if s.uuid}

    def _plugin_managed(self, gpus: list[Device], node: str, strict: bool) -> set[str]:
        """The GPUs a device plugin advertises as `gpu_resource`."""
        resource = self.settings.gpu_resource
        try:
            ids = self.podresources.allocatable(resource) if self.podresources else None
        except PodResourcesError as exc:
            if strict:
                raise UpstreamError(f"PodResources: {exc}") from exc
            log.warning("PodResources: %s", exc)
            return set()
        if ids is None:  # the kubelet cannot say which: the node's allocatable says whether
            try:
                assert self.kube is not None
                offered = self.kube.node_allocatable(node, resource)
            except ApiError as exc:
                if strict:
                    raise
                log.warning("cannot read node %s: %s", node, exc.message)
                return set()
            return {d.key for d in gpus} if offered > 0 else set()
        managed: set[str] = set()
        inventory = self.engine.inventory
        for device_id in ids:
            device = inventory.kubelet_device(device_id)
            if device is None:
                continue
            managed |= {d.key for d in inventory.overlapping(inventory.footprint(device))}
        return managed & {d.key for d in gpus}


def is_gpu(device: Device) -> bool:
    """A GPU or MIG device, or a CDI device named by a GPU's UUID (`nvidia.com/gpu=GPU-
    <uuid>`): where no driver GPU lies under it (a CDI-only inventory, the stand-in
    driver of the suspend tests) it is that GPU in the books; elsewhere its case is its
    GPU's anyway."""
    return device.kind in GPU_KINDS or gpu_uuid(device) is not None


def _uuids(device: Device, engine: Engine) -> set[str]:
    """A GPU's UUID and its MIG devices', or a MIG device's and its parent's: a slice
    that lists either covers this device. Casefolded, as `Books.slices` is keyed."""
    uuid = gpu_uuid(device)
    uuids = {uuid.casefold()} if uuid else set()
    parent = engine.inventory.get(device.parent) if device.parent else None
    if parent is not None and parent.uuid:
        uuids.add(parent.uuid.casefold())
    return uuids
