"""The driver's part of mount, unmount and reconcile, over ledger records.

Like nodes: the plan is checked whole and written to the ledger before anything is
placed; `created` says which additions are ours to take out again.
"""

from __future__ import annotations

import logging

from hotmount.driver.files import DriverFile
from hotmount.driver.place import DriverPlacer, Mounted
from hotmount.driver.sources import DriverPlan
from hotmount.errors import HotmountError
from hotmount.state.ledger import DriverFileRecord

log = logging.getLogger(__name__)


def file_of(record: DriverFileRecord) -> DriverFile:
    return DriverFile(record.path, record.kind, record.source, record.source_root)


def mounted_of(record: DriverFileRecord) -> Mounted | None:
    if record.source_dev is None or record.source_ino is None:
        return None  # a record from before these were kept: compare with the host's file
    return Mounted(record.source_dev, record.source_ino, record.mnt_id)


def note_mounted(placer: DriverPlacer, record: DriverFileRecord) -> None:
    """Keep what a bind we placed shows, for unmount and repair to recognise it later."""
    found = placer.mounted(file_of(record))
    if found is not None:
        record.source_dev, record.source_ino, record.mnt_id = found


def records_for(plan: DriverPlan, placer: DriverPlacer) -> list[DriverFileRecord]:
    """Refuse any target that holds something else, before anything changes."""
    out = []
    for file in plan.files:
        placer.check(file)
        present = placer.state(file) == "present"
        out.append(
            DriverFileRecord(
                path=file.path,
                kind=file.kind,
                source=file.source,
                source_root=file.source_root,
                created=not present,
            )
        )
    return out


def place_all(placer: DriverPlacer, records: list[DriverFileRecord]) -> None:
    for record in records:
        if record.created:
            placer.place(file_of(record))
            note_mounted(placer, record)


def remove_all(
    placer: DriverPlacer, records: list[DriverFileRecord]
) -> tuple[list[str], list[str]]:
    """Links first, then the mounts they point at: (removed, detached lazily)."""
    removed, detached = [], []
    for record in sorted(records, key=lambda r: r.kind != "symlink"):
        if not record.created:
            continue
        try:
            gone, lazily = placer.remove(file_of(record), True, mounted_of(record))
        except HotmountError as exc:
            log.warning("leaving %s alone: %s", record.path, exc.message)
            continue
        if gone:
            removed.append(record.path)
        if lazily:
            detached.append(record.path)
    return removed, detached


def repair(placer: DriverPlacer, records: list[DriverFileRecord]) -> int:
    """Put back additions someone removed; something else in their place stays."""
    restored = 0
    for record in records:  # binds before the links to them, as placed
        file = file_of(record)
        state = placer.state(file, mounted_of(record))
        if state == "absent":
            placer.place(file)
            record.created = True
            note_mounted(placer, record)
            restored += 1
        elif state == "mismatch":
            log.warning("%s is no longer the driver's file; left alone", record.path)
    return restored
