"""An unmount's use check: what leaves the container, and who in it still holds that.

hotmount/host/usage.py finds and stops holders of device numbers and NVML GPUs and knows
nothing of records or the inventory; this module turns one unmount (the devices that
leave, those that stay) into that question. Kept out of hotmount/engine/core.py, which asks
it under the container's lock before anything is revoked.
"""

from __future__ import annotations

from pathlib import Path

from hotmount.devices.inventory import Inventory
from hotmount.engine import plan
from hotmount.host import usage
from hotmount.host.containers import Container
from hotmount.state.ledger import ContainerRecord, NodeRecord


class UseCheck:
    """Nothing may hold what leaves; `force` stops its holders, but (asked to spare the
    devices that stay) never one that also holds a device that stays."""

    def __init__(self, proc: Path, use_nvml: bool, grace: float) -> None:
        self.proc = proc
        self.use_nvml = use_nvml
        self.grace = grace  # seconds between a forced holder's SIGTERM and its SIGKILL

    def clear(
        self,
        inventory: Inventory,
        container: Container,
        record: ContainerRecord,
        targets: list[str],
        leaving: list[NodeRecord],
        force: bool,
        spare_staying: bool,
    ) -> usage.Clearance:
        """Nothing may hold what leaves: the nodes that leave (a shared control node such
        as nvidiactl only with the last device that uses it) and, by NVML, the leaving
        GPUs. `force` stops those holders, but with `spare_staying` never one that also
        holds a staying device's own node or has an NVML context on a staying GPU.

        The `Clearance` it answers is the caller's to close; under `force`, where the look
        could not finish, its `after_revoke()` stops the holders and the processes the
        look could not clear once the device is revoked (hotmount/host/usage.py)."""
        staying = [k for k in record.devices if k not in targets]
        own = {k: d.nodes for k in staying if (d := inventory.get(k)) is not None}
        kept = plan.kept_numbers(record, targets, own) if spare_staying else set()
        nvml = self.use_nvml
        return usage.clear_holders(
            self.proc,
            container.key,
            container.pids,
            {(n.major, n.minor) for n in leaving},
            _uuids(inventory, targets) if nvml else [],
            force=force,
            grace=self.grace,
            staying_numbers=kept,
            staying_uuids=_uuids(inventory, staying) if nvml and spare_staying else [],
        )


def _uuids(inventory: Inventory, keys: list[str]) -> list[str]:
    return [d.uuid for k in keys if (d := inventory.get(k)) and d.uuid]
