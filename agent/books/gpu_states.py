"""How many of the node's GPUs are free, given by the kubelet, hot-mounted or pinned:
the dashboard's "GPUs per node", read at scrape time from the inventory, the ledger and
the kubelet's books (nothing is kept in step, as with the per-mount gauges)."""

from __future__ import annotations

from dataclasses import dataclass

from agent.books.kubelet import KubeletBooks
from agent.books.pins import pin_of
from hotmount.api import DeviceKind, Engine

# One state per GPU, the first that applies. `pinned`: hot-mounted and kept in the
# scheduler's books by a pin; `allocated`: the kubelet gave it to a pod, not hot-mounted.
GPU_STATES = ("pinned", "hot_mounted", "allocated", "free")


@dataclass(frozen=True)
class GpuStates:
    engine: Engine
    kubelet: KubeletBooks

    def counts(self) -> dict[str, int]:
        """Each state's number of whole GPUs (a GPU whose MIG instance is hot-mounted
        counts as hot-mounted: the footprints overlap)."""
        inventory = self.engine.inventory
        claims = self.engine.mounts.claims()
        pinned = {
            (record.key, entry.key)
            for record in self.engine.mounts.records()
            for entry in record.devices.values()
            if pin_of(entry.metadata)
        }
        given = [hold.footprint for hold in self.kubelet.holds()]
        counts = dict.fromkeys(GPU_STATES, 0)
        for gpu in (d for d in inventory.devices if d.kind is DeviceKind.GPU):
            mine = inventory.footprint(gpu)
            hot = [c for c in claims if c.footprint.overlaps(mine)]
            if any((c.owner, c.device) in pinned for c in hot):
                counts["pinned"] += 1
            elif hot:
                counts["hot_mounted"] += 1
            elif any(footprint.overlaps(mine) for footprint in given):
                counts["allocated"] += 1
            else:
                counts["free"] += 1
        return counts
