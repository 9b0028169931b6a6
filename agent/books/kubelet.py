"""The kubelet's books: which pod the kubelet gave each device, read from PodResources.

Hot-mounts are the engine's books; these are the scheduler's. A named mount is refused
(409) where the kubelet gave the same physical device to another running pod, and a
mount by count takes the devices the kubelet gave its holder pod.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from agent import rdma_resources
from agent.books.dra import DraNames, slice_devices
from agent.books.holders import HOLDER_LABEL, ROLE_LABEL, Role
from agent.common.results import device_label, require_kube
from agent.config import AgentSettings
from agent.errors import AllocatedToPod, ApiError, UpstreamError
from agent.kube.client import KubeClient, PodInfo
from agent.kube.dra import ResourceApi
from agent.podresources import Allocation, PodResourcesClient, PodResourcesError
from hotmount.api import (
    Claim,
    Device,
    DeviceKind,
    Engine,
    Footprint,
    Workload,
    blocking_claims,
    is_rdma,
)
from hotmount.wire.schemas import DeviceHolder

log = logging.getLogger(__name__)

KUBELET = "kubelet:"


@dataclass(frozen=True)
class KubeletHold:
    """One device ID the kubelet gave a pod, and the physical device behind it."""

    allocation: Allocation
    device_id: str
    footprint: Footprint
    shared: bool = False  # a shared RDMA resource's: every pod given it holds its HCAs

    @property
    def pod(self) -> str:
        return f"{self.allocation.pod_namespace}/{self.allocation.pod_name}"

    def holder(self) -> DeviceHolder:
        a = self.allocation
        return DeviceHolder(
            source="kubelet",
            namespace=a.pod_namespace,
            pod=a.pod_name,
            container=a.container_name,
            device=self.device_id,
        )

    def claim(self) -> Claim:
        a = self.allocation
        return Claim(
            f"{KUBELET}{a.pod_namespace}/{a.pod_name}",
            self.device_id,
            f"{a.pod_namespace}/{a.pod_name}",
            self.footprint,
            holder=Workload(a.pod_namespace, a.pod_name, a.container_name),
        )


@dataclass(frozen=True)
class GpuBooks:
    given: dict[tuple[str, str], list[str]]  # (namespace, pod) to inventory keys
    free: list[str]  # inventory keys of the devices the kubelet gave no pod


@dataclass(frozen=True)
class UnmappedId:
    """An ID of an `--rdma-resource` the inventory cannot name: it could be any RDMA NIC."""

    allocation: Allocation
    device_id: str


@dataclass(frozen=True)
class KubeletBooks:
    settings: AgentSettings
    engine: Engine
    kube: KubeClient | None
    podresources: PodResourcesClient | None
    resources: ResourceApi | None = None  # DRA: ResourceSlices name the prepared devices

    def holds(self, strict: bool = False) -> list[KubeletHold]:
        """What the kubelet gave each pod, as physical devices: an ID of any form (UUID,
        `UUID::n`, MIG UUID, index, CDI name, PCI address) maps through the inventory;
        a shared RDMA resource holds every HCA it covers. Empty without PodResources; an
        ID the inventory does not know is skipped. `strict`: a PodResources failure is an
        error (a check must fail closed, not read as free)."""
        return self._books(strict)[0]

    def _books(self, strict: bool) -> tuple[list[KubeletHold], list[UnmappedId]]:
        """The holds, and the `--rdma-resource` IDs that map to no RDMA device."""
        if self.podresources is None:
            return [], []
        try:
            allocations = self.podresources.list_allocations()
        except PodResourcesError as exc:
            if strict:
                raise UpstreamError(
                    f"PodResources did not answer ({exc}), so the kubelet's allocations "
                    "cannot be checked; retry, or pass force to mount anyway"
                ) from exc
            log.warning("PodResources unavailable: %s", exc)
            return [], []
        inventory = self.engine.inventory
        shared = self._shared_coverage()
        rdma_pools = set(self.settings.rdma_resource)
        holds: list[KubeletHold] = []
        unmapped: list[UnmappedId] = []
        for allocation in allocations:
            resource = allocation.resource_name
            if resource in shared:
                # Its IDs are tokens ("0".."N-1"), not devices: the allocation holds them all.
                held = f"{resource} (shared)"
                holds += [
                    KubeletHold(allocation, held, inventory.footprint(d), shared=True)
                    for d in shared[resource]
                ]
                continue
            for device_id in allocation.device_ids:
                if resource in rdma_pools:
                    device = rdma_resources.rdma_device(device_id, inventory)
                    if device is None:
                        unmapped.append(UnmappedId(allocation, device_id))
                        continue
                else:
                    device = inventory.kubelet_device(device_id)
                if device is None:
                    log.debug("kubelet device %s is not in the inventory", device_id)
                    continue
                holds.append(KubeletHold(allocation, device_id, inventory.footprint(device)))
        return holds + self._claim_holds(strict), unmapped

    def _shared_coverage(self) -> dict[str, list[Device]]:
        """Each `--rdma-shared-resource` and the RDMA devices it gives its pods."""
        inventory = self.engine.inventory
        out: dict[str, list[Device]] = {}
        for value in self.settings.rdma_shared_resource:
            shared = rdma_resources.parse_shared(value)
            out[shared.name] = rdma_resources.covered(shared, inventory)
        return out

    def _claim_holds(self, strict: bool) -> list[KubeletHold]:
        """DRA: the devices the kubelet prepared for pods' ResourceClaims, by the slice
        device (driver, pool, device) that names them, mapped to the GPU by UUID (NVIDIA's
        CDI names are per claim, so they name no GPU; a kubelet before 1.31 gives only
        those, and `holds` tries them as they are)."""
        if self.podresources is None or self.resources is None:
            return []
        try:
            prepared = self.podresources.list_claim_allocations()
            if not prepared:
                return []
            node = self.settings.node_name or ""
            names = DraNames.of(self.settings)
            uuids = {
                (d.driver, d.pool, d.device): d.uuid
                for d in slice_devices(self.resources.node_slices(node), node, names)
                if d.uuid
            }
        except (PodResourcesError, ApiError) as exc:
            if strict:
                raise UpstreamError(f"DRA allocations cannot be checked: {exc}") from exc
            log.warning("DRA allocations unavailable: %s", exc)
            return []
        # A driver may spell a UUID in another case than NVML (gpu- for GPU-)
        inventory = {d.uuid.casefold(): d for d in self.engine.inventory.devices if d.uuid}
        holds = []
        for namespace, pod, container, claim in prepared:
            published = uuids.get((claim.driver, claim.pool, claim.device))
            device = inventory.get(published.casefold()) if published else None
            if device is None or device.uuid is None:
                continue  # its CDI names came with list_allocations, tried there
            uuid = device.uuid
            allocation = Allocation(namespace, pod, container, claim.driver, (uuid,))
            holds.append(KubeletHold(allocation, uuid, self.engine.inventory.footprint(device)))
        return holds

    def refuse_allocated(
        self, devices: list[Device], target: PodInfo, share: str | None = None
    ) -> None:
        """409 for a device whose physical GPU the kubelet gave another running pod, under
        any name; the pod named in `shareWith` (or its sharing circle) is no obstacle. An
        RDMA device is also refused while an `--rdma-resource` ID maps to none (it could be
        this one), and where a shared RDMA resource covers it, unless this pod (or the one
        it shares with) was given that resource."""
        holds, unmapped = self._books(strict=True)
        group = f"{target.namespace}/{target.name}"
        nics = [d for d in devices if is_rdma(d)]
        if nics and unmapped:
            raise _unmapped_error(nics, unmapped)
        shared = self._shared_coverage()
        if nics and shared:
            self._refuse_shared(nics, shared, holds, {group, *([share] if share else [])})
        holds = [h for h in holds if not h.shared]
        if not holds:
            return
        held = [*self.engine.mounts.claims(), *(h.claim() for h in holds)]
        for device in devices:
            new = Claim("", device.key, group, self.engine.inventory.footprint(device))
            for blocker in blocking_claims(new, held, share):
                if not blocker.owner.startswith(KUBELET):
                    continue  # a hot-mount: the engine's claim decides, atomically
                assert blocker.holder is not None  # the kubelet's claims all name their pod
                owner = (blocker.holder.namespace or "", blocker.holder.pod or "")
                other = require_kube(self.kube).find_pod(*owner)
                if other is None or other.phase not in ("Running", "Pending"):
                    continue
                if (
                    other.labels.get(HOLDER_LABEL) == target.name
                    and other.namespace == target.namespace
                ):
                    continue  # our own holder for this very pod
                if other.labels.get(ROLE_LABEL) in (Role.PIN, Role.BLOCKER):
                    # A pin stands for a hot-mount, whose claim decides, by name; a
                    # blocker holds a free GPU for a moment while a pin is made.
                    continue
                raise AllocatedToPod(
                    f"device {device_label(device)} is the same physical device the kubelet "
                    f"allocated to running pod {owner[0]}/{owner[1]} (as {blocker.device}); "
                    "share it on purpose (shareWith), or pass force to mount it anyway",
                    {
                        "namespace": owner[0],
                        "pod": owner[1],
                        "holders": [{**blocker.holder.fields(), "device": blocker.device}],
                    },
                )

    def _refuse_shared(
        self,
        nics: list[Device],
        shared: dict[str, list[Device]],
        holds: list[KubeletHold],
        mine: set[str],
    ) -> None:
        """A shared resource holds its HCAs as a whole: they go to its own pods only."""
        given = {h.allocation.resource_name for h in holds if h.pod in mine}
        for device in nics:
            for resource, covered in shared.items():
                if resource in given or device.key not in {d.key for d in covered}:
                    continue
                users = sorted({h.pod for h in holds if h.allocation.resource_name == resource})
                raise AllocatedToPod(
                    f"device {device_label(device)} is an HCA of the shared RDMA resource "
                    f"{resource}, which holds it for the pods the kubelet gives {resource} "
                    f"(now: {', '.join(users) or 'none'}); request {resource} in the pod's "
                    "resources, or pass force to mount it anyway",
                    {"resource": resource, "pods": users},
                )

    def holder_devices(self, namespace: str, name: str) -> list[str]:
        """The devices (inventory keys) the kubelet gave holder pod `name`."""
        return self.given_to(namespace, [name])[name]

    def given_to(self, namespace: str, names: list[str]) -> dict[str, list[str]]:
        """The devices (inventory keys) the kubelet gave each of these holder pods."""
        allocations = self._allocations("mounting by count or pinning a GPU")
        given: dict[str, list[str]] = {name: [] for name in names}
        for a in allocations:
            if a.pod_namespace != namespace or a.pod_name not in given:
                continue
            if a.resource_name != self.settings.gpu_resource:
                continue
            for device_id in a.device_ids:
                device = self.engine.inventory.kubelet_device(device_id)
                if device is None:
                    raise UpstreamError(
                        f"the kubelet gave {a.pod_name} device {device_id}, "
                        "which is not in this node's inventory"
                    )
                given[a.pod_name].append(device.key)
        return {name: list(dict.fromkeys(keys)) for name, keys in given.items()}

    def gpu_books(self, free: bool = True) -> GpuBooks:
        """One read of the kubelet's `gpu_resource` books: the devices each pod was given
        (from its admission on: the device manager allocates then, before any container
        starts), and, with `free`, the devices given to none."""
        resource = self.settings.gpu_resource
        given: dict[tuple[str, str], list[str]] = {}
        used: set[str] = set()
        for a in self._allocations("pinning a GPU"):
            if a.resource_name != resource:
                continue
            keys = given.setdefault((a.pod_namespace, a.pod_name), [])
            for device_id in a.device_ids:
                used.add(device_id)
                device = self.engine.inventory.kubelet_device(device_id)
                if device is not None and device.key not in keys:
                    keys.append(device.key)
        if not free:
            return GpuBooks(given, [])
        assert self.podresources is not None
        try:
            offered = self.podresources.allocatable(resource)
        except PodResourcesError as exc:
            raise UpstreamError(f"PodResources: {exc}") from exc
        inventory = self.engine.inventory
        if offered is None:  # a 1.20 kubelet: the plugin offers every GPU (accounting.py)
            offered = [d.key for d in inventory.devices if d.kind is DeviceKind.GPU]
        taken = {k for keys in given.values() for k in keys}
        keys = [d.key for i in offered if i not in used and (d := inventory.kubelet_device(i))]
        return GpuBooks(given, [k for k in dict.fromkeys(keys) if k not in taken])

    def _allocations(self, needed_for: str) -> list[Allocation]:
        if self.podresources is None:
            raise UpstreamError(f"{needed_for} needs the kubelet's PodResources socket")
        try:
            return self.podresources.list_allocations()
        except PodResourcesError as exc:
            raise UpstreamError(f"PodResources: {exc}") from exc


def _unmapped_error(nics: list[Device], unmapped: list[UnmappedId]) -> AllocatedToPod:
    """Fail closed: an ID of an RDMA pool that names no RDMA device could be any of them."""
    first = unmapped[0]
    a = first.allocation
    return AllocatedToPod(
        f"the kubelet gave pod {a.pod_namespace}/{a.pod_name} device ID {first.device_id!r} "
        f"of RDMA resource {a.resource_name}, which names no RDMA device of this node's "
        f"inventory, so it may be {device_label(nics[0])}: RDMA devices are refused until "
        "every ID of that resource maps (a PCI address of an RDMA function; check "
        "--rdma-resource and the plugin's config), or pass force to mount anyway",
        {
            "namespace": a.pod_namespace,
            "pod": a.pod_name,
            "resource": a.resource_name,
            "unmapped": [u.device_id for u in unmapped],
        },
    )
