"""What a dead container had, kept for its successor: the agent's own store.

An *intent* (agent/node/remounts.py) is the agent's idea, not the engine's: it names a
pod's container by the pod's UID and the container's name, holds no grant and no claim,
and is mounted again through the engine's public `mount` once the successor runs. So it
lives here, beside the agent's other state (desired specs, idle clocks), not in the
engine's ledger. Layout under the state directory, one file per intent, written whole
(temp file, rename):

    intents/<sha256 of the key>.json

The directory is the one older agents' ledgers used; their files (named after the key)
are renamed to the digest names at start (`_migrate`), so an upgrade keeps what a
crash-looping container is owed, and no intent is ever in two files.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import re
from collections.abc import Iterable
from pathlib import Path

from pydantic import BaseModel

from hotmount.api import DeviceRecord, atomic_write

log = logging.getLogger(__name__)
INTENT_VERSION = 1
DIGEST_NAME = re.compile(r"^[0-9a-f]{64}\.json$")


class Intent(BaseModel):
    """What a container that died had, to be mounted again into the one that replaces
    it. `owner`: who that is (namespace, pod, its UID, the container's name and old ID);
    it holds no grant and no claim: the devices are free until mounted again."""

    version: int = INTENT_VERSION
    key: str  # <pod UID>/<container name>
    owner: dict[str, str]
    devices: dict[str, DeviceRecord]
    saved_at: str
    # whether it had the driver's files: its successor gets them again, or not, whatever
    # the node's default (None: an intent saved before this was kept)
    with_driver: bool | None = None


def file_name(key: str) -> str:
    """69 characters whatever the key (a pod UID and a 63-character container name)."""
    return hashlib.sha256(key.encode()).hexdigest() + ".json"


def named_holders(intents: Iterable[Intent]) -> set[tuple[str, str]]:
    """(namespace, holder) of every pin and holder an intent names: kept while it waits."""
    return {
        (d.metadata["namespace"], d.metadata["holder"])
        for intent in intents
        for d in intent.devices.values()
        if d.metadata.get("namespace") and d.metadata.get("holder")
    }


class Intents:
    """The store: save, delete, read all. Reads skip (and log) a file that does not parse."""

    def __init__(self, state_dir: Path) -> None:
        self.directory = state_dir / "intents"
        self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._migrate()

    def _path(self, key: str) -> str:
        return os.path.join(self.directory, file_name(key))

    def _migrate(self) -> None:
        """Rename the files the engine's ledger wrote (named after the key) to digest names."""
        for path in sorted(self.directory.glob("*.json")):
            if DIGEST_NAME.match(path.name):
                continue
            found = self._read(path)
            if found is None:
                continue  # left where it is, and read by nobody
            new = self._path(found.key)
            if not os.path.exists(new):  # a newer intent under the new name wins
                os.replace(path, new)
            else:
                path.unlink()

    def save(self, intent: Intent) -> None:
        atomic_write(self._path(intent.key), intent.model_dump_json().encode())

    def delete(self, key: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._path(key))

    def all(self) -> list[Intent]:
        found = []
        for path in sorted(self.directory.glob("*.json")):
            if DIGEST_NAME.match(path.name) and (intent := self._read(path)) is not None:
                found.append(intent)
        return found

    def named_holders(self) -> set[tuple[str, str]]:
        """(namespace, holder) of every pin and holder a kept intent names."""
        return named_holders(self.all())

    @staticmethod
    def _read(path: Path) -> Intent | None:
        try:
            return Intent.model_validate_json(path.read_bytes())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            log.warning("ignoring unreadable intent %s: %s", path, exc)
            return None
