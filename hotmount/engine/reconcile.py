"""What reconcile repairs: a live container's drift (a grant or node someone removed,
a v2 program replaced without our wrapper), and claims without a record or unreadable
ones (the ledger's claims are the node-wide "one device, one holder" index).

The engine decides which containers are alive and finishes pending operations under
each container's lock (hotmount/engine/core.py); these steps put back what the record says.
"""

from __future__ import annotations

import logging

from hotmount.devices.inventory import Inventory
from hotmount.engine import plan
from hotmount.engine.grants import CgroupGrants, rule_of
from hotmount.engine.results import ReconcileReport
from hotmount.errors import UnsafePath
from hotmount.state import claims
from hotmount.state.claims import Claim
from hotmount.state.ledger import ContainerRecord, Ledger
from hotmount.tenantfs.devnodes import ContainerFs, NodeState

log = logging.getLogger(__name__)


def sweep_claims(ledger: Ledger, inventory: Inventory) -> None:
    """Drop claims no record stands behind; rewrite unreadable ones from the record.

    A mount writes its record before its claim: so a claim read first, then no
    record, is stale (a record list taken before the claims would miss a mount
    that landed in between, and free the device it had just claimed).
    """
    with ledger.claims_lock():
        ledger.sweep_temp_claims()
    for owner in sorted({c.owner for c in ledger.claims()}):
        with ledger.lock(owner), ledger.claims_lock():
            record = ledger.load(owner)
            mine = [c for c in ledger.claims() if c.owner == owner]
            wanted = set(record.devices) if record else set()
            if record is not None and record.pending and record.pending.op == "mount":
                wanted |= set(record.pending.devices)
            for claim in mine:
                if not claim.footprint.unknown and claim.device not in wanted:
                    ledger.release(claim.device, owner)
            if record is None or not any(c.footprint.unknown for c in mine):
                if record is None:
                    ledger.release_unreadable(owner)
                continue
            readable = {c.device for c in mine if not c.footprint.unknown}
            ledger.add_claims(claims_of(record, set(record.devices) - readable, inventory))
            ledger.release_unreadable(owner)
            log.warning("rewrote the unreadable claims of %s from its record", owner)


def claims_of(record: ContainerRecord, keys: set[str], inventory: Inventory) -> list[Claim]:
    """The claims a record stands behind, for the devices `keys`."""
    out = []
    for key in sorted(keys):
        entry, device = record.devices[key], inventory.get(key)
        footprint = inventory.footprint(device) if device else claims.UNKNOWN
        group = entry.group or record.key
        out.append(Claim(record.key, key, group, footprint, entry.shared_with, entry.workload))
    return out


def repair_drift(
    record: ContainerRecord, grants: CgroupGrants, fs: ContainerFs, report: ReconcileReport
) -> None:
    """Grant again what the record granted (v1 lines, v2 map entries and wrapper), and
    create again the nodes someone removed; counted in `report`. The caller saves.

    A node whose path the tenant made unsafe (its directory replaced by a symlink or a
    volume: hotmount/tenantfs/devnodes.py refuses it without looking inside) is named in
    `report.errors`, and the other nodes are still repaired."""
    v1 = grants.v1(record.v1_dir)
    if v1 is not None:
        for node_record in record.nodes.values():
            if node_record.v1_added and not v1.allows(rule_of(node_record)):
                v1.allow(rule_of(node_record))
                report.regranted += 1
    v2 = grants.v2(record.v2_dir)
    if v2 is not None and record.nodes:
        rules = [rule_of(n) for n in record.nodes.values()]
        before = v2.state()
        report.rewrapped += v2.grant(rules)
        if before.restricted:
            report.regranted += len(set(rules) - before.grants)
    refused: dict[str, None] = {}  # the refusals, once each (a bad /dev refuses every node)
    for node_record in record.nodes.values():
        node = plan.node_of(node_record)
        try:
            if fs.state(node) is NodeState.ABSENT:
                fs.ensure(node)
                node_record.created = True
                report.recreated += 1
        except UnsafePath as exc:
            refused[exc.message] = None
    if refused:
        report.errors[record.key] = "; ".join(refused)
        log.warning("reconcile %s: %s", record.key, report.errors[record.key])
