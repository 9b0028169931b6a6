"""The idle clocks kept beside the ledger, so an agent restart never shortens one.

One JSON file, `idle-clocks.json` in the state directory, rewritten whole (the ledger's
atomic_write) when a clock starts, resets or is warned, not on every look: a pass that
changes nothing writes nothing. Keys are the mount's clock key (container, device,
mount ID), so a GPU mounted anew never inherits an old clock. An unreadable file is
logged and ignored: the clocks then start again, later, never sooner.

`Look` is one mount as a pass found it: the piece that the reclaim and the idle
suspension share (agent/idle/reclaim.py, idle_suspend.py), kept here so that
neither imports the other back.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Hashable
from dataclasses import dataclass
from pathlib import Path

from agent.idle import policy as idle
from hotmount.api import ContainerRecord, DeviceRecord, HotmountError, atomic_write

log = logging.getLogger(__name__)

FILE_NAME = "idle-clocks.json"
_SEPARATOR = "\t"  # never in a container key, a device key or a mount ID


@dataclass(frozen=True)
class Look:
    """One mount as an idle pass found it (agent/idle/reclaim.py), handed to its
    warning, its reclaim or its suspension (agent/idle/suspend.py)."""

    record: ContainerRecord
    entry: DeviceRecord
    key: tuple[str, str, str]  # its clock key
    since: float | None  # idle since (wall clock); None: in use
    now: float


class IdleState:
    def __init__(self, state_dir: Path) -> None:
        self.path = state_dir / FILE_NAME
        self._written: object = None

    def load(self, clock: idle.IdleClock, now: float) -> None:
        try:
            data = json.loads(self.path.read_text())
        except FileNotFoundError:
            return
        except (OSError, ValueError) as exc:
            log.warning("ignoring %s: %s", self.path, exc)
            return
        if not isinstance(data, dict):
            return
        for name, value in data.items():
            if not isinstance(value, dict):
                continue
            since, warned = value.get("idleSince"), value.get("warnedAt")
            if not _time(since) or (warned is not None and not _time(warned)):
                continue
            clock.restore(tuple(name.split(_SEPARATOR)), since, warned, now)
        self._written = self._snapshot(clock)

    def save(self, clock: idle.IdleClock) -> None:
        """Write the clocks if they changed since the last write."""
        snapshot = self._snapshot(clock)
        if snapshot == self._written:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write(str(self.path), json.dumps(snapshot, sort_keys=True).encode())
        except (OSError, HotmountError) as exc:
            log.warning("cannot keep the idle clocks: %s", exc)
            return
        self._written = snapshot

    @staticmethod
    def _snapshot(clock: idle.IdleClock) -> dict[str, dict[str, float | None]]:
        """Only running clocks: a mount used at the last look has nothing to keep."""
        return {
            _name(key): {"idleSince": since, "warnedAt": warned}
            for key, since, warned in clock.items()
            if since is not None
        }


def _name(key: Hashable) -> str:
    parts = key if isinstance(key, tuple) else (key,)
    return _SEPARATOR.join(str(p) for p in parts)


def _time(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value >= 0


def clock_key(owner: str, entry: DeviceRecord) -> tuple[str, str, str]:
    """One mount: a device unmounted and mounted again starts a new idle clock."""
    return (owner, entry.key, entry.metadata.get(idle.MOUNT_ID_KEY) or entry.mounted_at)
