"""The kubelet's books: which pod the kubelet gave each device, read from PodResources.

Hot-mounts are the engine's books; these are the scheduler's. A named mount is refused
(409) where the kubelet gave the same physical device to another running pod, and a
mount by count takes the devices the kubelet gave its holder pod.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from agent.config import AgentSettings
from agent.errors import AllocatedToPod, UpstreamError
from agent.kube.client import KubeClient, PodInfo
from agent.node.holders import HOLDER_LABEL
from agent.node.results import device_label, require_kube
from agent.podresources import Allocation, PodResourcesClient, PodResourcesError
from agent.schemas import DeviceHolder
from hotmount import claims
from hotmount import engine as eng
from hotmount.claims import Claim, Footprint
from hotmount.devices.model import Device

log = logging.getLogger(__name__)

KUBELET = "kubelet:"


@dataclass(frozen=True)
class KubeletHold:
    """One device ID the kubelet gave a pod, and the physical device behind it."""

    allocation: Allocation
    device_id: str
    footprint: Footprint

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
            holder={"namespace": a.pod_namespace, "pod": a.pod_name, "container": a.container_name},
        )


@dataclass(frozen=True)
class KubeletBooks:
    settings: AgentSettings
    engine: eng.Engine
    kube: KubeClient | None
    podresources: PodResourcesClient | None

    def holds(self, strict: bool = False) -> list[KubeletHold]:
        """What the kubelet gave each pod, as physical devices: an ID of any form (UUID,
        `UUID::n`, MIG UUID, index, CDI name) maps through the inventory. Empty without
        PodResources; an ID the inventory does not know is skipped. `strict`: a
        PodResources failure is an error (a check must fail closed, not read as free)."""
        if self.podresources is None:
            return []
        try:
            allocations = self.podresources.list_allocations()
        except PodResourcesError as exc:
            if strict:
                raise UpstreamError(
                    f"PodResources did not answer ({exc}), so the kubelet's allocations "
                    "cannot be checked; retry, or pass force to mount anyway"
                ) from exc
            log.warning("PodResources unavailable: %s", exc)
            return []
        holds = []
        for allocation in allocations:
            for device_id in allocation.device_ids:
                device = self.engine.inventory.kubelet_device(device_id)
                if device is None:
                    log.debug("kubelet device %s is not in the inventory", device_id)
                    continue
                holds.append(
                    KubeletHold(allocation, device_id, self.engine.inventory.footprint(device))
                )
        return holds

    def refuse_allocated(
        self, devices: list[Device], target: PodInfo, share: str | None = None
    ) -> None:
        """409 for a device whose physical GPU the kubelet gave another running pod, under
        any name; the pod named in `shareWith` (or its sharing circle) is no obstacle."""
        holds = self.holds(strict=True)
        if not holds:
            return
        group = f"{target.namespace}/{target.name}"
        held = [*self.engine.ledger.claims(), *(h.claim() for h in holds)]
        for device in devices:
            new = Claim("", device.key, group, self.engine.inventory.footprint(device))
            for blocker in claims.blocking(new, held, share):
                if not blocker.owner.startswith(KUBELET):
                    continue  # a hot-mount: the engine's claim decides, atomically
                owner = (blocker.holder["namespace"], blocker.holder["pod"])
                other = require_kube(self.kube).find_pod(*owner)
                if other is None or other.phase not in ("Running", "Pending"):
                    continue
                if (
                    other.labels.get(HOLDER_LABEL) == target.name
                    and other.namespace == target.namespace
                ):
                    continue  # our own holder for this very pod
                raise AllocatedToPod(
                    f"device {device_label(device)} is the same physical device the kubelet "
                    f"allocated to running pod {owner[0]}/{owner[1]} (as {blocker.device}); "
                    "share it on purpose (shareWith), or pass force to mount it anyway",
                    {
                        "namespace": owner[0],
                        "pod": owner[1],
                        "holders": [{**dict(blocker.holder), "device": blocker.device}],
                    },
                )

    def holder_devices(self, namespace: str, name: str) -> list[str]:
        """The devices (inventory keys) the kubelet gave holder pod `name`."""
        if self.podresources is None:
            raise UpstreamError("mounting by count needs the kubelet's PodResources socket")
        try:
            allocations = self.podresources.list_allocations()
        except PodResourcesError as exc:
            raise UpstreamError(f"PodResources: {exc}") from exc
        keys = []
        for a in allocations:
            if (a.pod_namespace, a.pod_name, a.resource_name) == (
                namespace,
                name,
                self.settings.gpu_resource,
            ):
                for device_id in a.device_ids:
                    device = self.engine.inventory.kubelet_device(device_id)
                    if device is None:
                        raise UpstreamError(
                            f"the kubelet gave {name} device {device_id}, "
                            "which is not in this node's inventory"
                        )
                    keys.append(device.key)
        return list(dict.fromkeys(keys))
