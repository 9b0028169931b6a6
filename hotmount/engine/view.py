"""A read-only view of the engine's books: what is mounted where, and who holds what.

For the layers above the engine (the agent, the CLI), which read the books but must
never write them: each call reads the ledger afresh, so a record it returns is the
caller's copy, and changing it changes nothing on disk.
"""

from __future__ import annotations

from hotmount.state.claims import Claim
from hotmount.state.ledger import ContainerRecord, Ledger


class Mounts:
    def __init__(self, ledger: Ledger) -> None:
        self._ledger = ledger

    def records(self) -> list[ContainerRecord]:
        """Every container's record: its devices, nodes and suspension."""
        return self._ledger.records()

    def record(self, key: str) -> ContainerRecord | None:
        """The record of the container `key`, if it has one."""
        return self._ledger.load(key)

    def claims(self) -> list[Claim]:
        """Every claim on a physical device (an unreadable one holds everything)."""
        return self._ledger.claims()
