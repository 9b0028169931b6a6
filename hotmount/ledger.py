"""What the engine added, to which container: per container, crash-safe.

The kernel is the truth for grants; the ledger says which of them are *ours*,
so that unmount, status and reconcile work after a restart and never remove
what the runtime granted itself. Layout under the state directory:

    containers/<key>.json   one record per container (atomic: temp file, rename)
    claims/<device>         which container holds a device (O_EXCL: one winner)
    locks/<key>.lock        flock held for the length of one operation on a container

A record carries a `pending` plan while an operation runs. If the process dies
midway, reconcile finds it: a pending mount is rolled back, a pending unmount
rolled forward, so no node is left without its grant, nor a grant without its
record. There is no global lock: operations on different containers never wait
for each other.

The ledger lives on tmpfs by default (/run/gpu-hotmount): it describes cgroup
grants, BPF maps and nodes in containers' namespaces, none of which survives a
reboot, so it should not either. Hence no fsync: rename alone is atomic against
a crash of the process, which is the failure that matters. A record that does
not parse is treated as absent (and its container forgotten by reconcile).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import re
import tempfile
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field

from hotmount.errors import KernelError

LEDGER_VERSION = 1
log = logging.getLogger(__name__)


class NodeRecord(BaseModel):
    path: str
    major: int
    minor: int
    file_mode: int
    permissions: str
    created: bool  # we made the node (else it was there: never remove it)
    v1_added: bool = False  # we wrote its devices.allow line (else the runtime had it)


class DeviceRecord(BaseModel):
    key: str
    kind: str
    node_paths: list[str]
    mounted_at: str
    metadata: dict[str, str] = Field(default_factory=dict)


class PendingOp(BaseModel):
    op: Literal["mount", "unmount"]
    devices: list[str]
    nodes: list[NodeRecord]  # nodes the operation creates or removes


class ContainerRecord(BaseModel):
    version: int = LEDGER_VERSION
    key: str
    container_id: str | None
    init_pid: int
    init_start_time: int  # guards against PID reuse
    v1_dir: str | None
    v2_dir: str | None
    devices: dict[str, DeviceRecord] = Field(default_factory=dict)
    nodes: dict[str, NodeRecord] = Field(default_factory=dict)
    pending: PendingOp | None = None


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


_SAFE = re.compile(r"[^A-Za-z0-9_.-]")


def _file_name(key: str) -> str:
    """Device and container keys hold '/' and '=': keep them readable and unique."""
    cleaned = _SAFE.sub("_", key)
    if cleaned == key and not key.startswith("."):
        return key
    return f"{cleaned[:80]}-{hashlib.sha256(key.encode()).hexdigest()[:12]}"


class Ledger:
    def __init__(self, state_dir: Path) -> None:
        self.state_dir = state_dir
        self._containers = state_dir / "containers"
        self._claims = state_dir / "claims"
        self._locks = state_dir / "locks"
        for directory in (self._containers, self._claims, self._locks):
            directory.mkdir(parents=True, exist_ok=True, mode=0o700)

    # -- records
    def load(self, key: str) -> ContainerRecord | None:
        return _parse(self._containers / f"{_file_name(key)}.json")

    def save(self, record: ContainerRecord) -> None:
        path = self._containers / f"{_file_name(record.key)}.json"
        if not record.devices and record.pending is None and not record.nodes:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
            return
        _atomic_write(path, record.model_dump_json(indent=1).encode())

    def delete(self, key: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            (self._containers / f"{_file_name(key)}.json").unlink()

    def records(self) -> list[ContainerRecord]:
        records = (_parse(path) for path in sorted(self._containers.glob("*.json")))
        return [record for record in records if record is not None]

    # -- per-container operation lock
    @contextlib.contextmanager
    def lock(self, key: str) -> Iterator[None]:
        fd = os.open(self._locks / f"{_file_name(key)}.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    # -- device claims
    def claim(self, device_key: str, owner: str) -> str | None:
        """Take the device for `owner`; return the current owner if someone else holds it."""
        path = self._claims / _file_name(device_key)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            holder = self.claim_owner(device_key)
            return None if holder in (owner, None) else holder
        try:
            os.write(fd, json.dumps({"device": device_key, "owner": owner}).encode())
        finally:
            os.close(fd)
        return None

    def take_over(self, device_key: str, owner: str) -> None:
        _atomic_write(
            self._claims / _file_name(device_key),
            json.dumps({"device": device_key, "owner": owner}).encode(),
        )

    def claim_owner(self, device_key: str) -> str | None:
        try:
            return json.loads((self._claims / _file_name(device_key)).read_text())["owner"]
        except (FileNotFoundError, ValueError, KeyError):
            return None

    def release(self, device_key: str, owner: str) -> None:
        if self.claim_owner(device_key) == owner:
            with contextlib.suppress(FileNotFoundError):
                (self._claims / _file_name(device_key)).unlink()

    def claims(self) -> dict[str, str]:
        out = {}
        for path in self._claims.iterdir():
            with contextlib.suppress(FileNotFoundError, ValueError, KeyError):
                data = json.loads(path.read_text())
                out[data["device"]] = data["owner"]
        return out


def _parse(path: Path) -> ContainerRecord | None:
    try:
        return ContainerRecord.model_validate_json(path.read_text())
    except FileNotFoundError:
        return None
    except ValueError as exc:  # pydantic's ValidationError is a ValueError
        log.warning("ignoring unreadable ledger record %s: %s", path, exc)
        return None


def _atomic_write(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        os.write(fd, data)
        os.close(fd)
        os.replace(tmp, path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.close(fd)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise KernelError(f"writing the ledger {path}: {exc.strerror}") from exc
