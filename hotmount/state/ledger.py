"""What the engine added, to which container: per container, crash-safe.

The kernel is the truth for grants; the ledger says which of them are *ours*,
so that unmount, status and reconcile work after a restart and never remove
what the runtime granted itself. Layout under the state directory:

    containers/<key>.json   one record per container (atomic: temp file, rename)
    claims/<owner>@<device> one container's hold on one device, with the device's
                            physical footprint (temp file, then link(2) into place)
    locks/<key>.lock        flock held for the length of one operation on a container

A record carries a `pending` plan while an operation runs. If the process dies
midway, reconcile finds it: a pending mount is rolled back, a pending unmount
rolled forward, so no node is left without its grant, nor a grant without its
record. Operations on different containers never wait for each other, except
for the instant claims are checked and written (`claims_lock`): claims are
about physical devices, where every name of one GPU meets (see
hotmount/state/claims.py for which claims collide).

The ledger lives on tmpfs by default (/run/gpu-hotmount): it describes cgroup
grants, BPF maps and nodes in containers' namespaces, none of which survives a
reboot, so it should not either. Hence no fsync: rename alone is atomic against
a crash of the process, which is the failure that matters. A record that does
not parse is treated as absent (and its container forgotten by reconcile).
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import logging
import os
import re
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, model_validator

from hotmount.errors import KernelError
from hotmount.state.claims import UNKNOWN, Claim, Footprint, Workload

LEDGER_VERSION = 1
CLAIM_VERSION = 2
log = logging.getLogger(__name__)


class NodeRecord(BaseModel):
    path: str
    major: int
    minor: int
    file_mode: int
    permissions: str
    created: bool  # we made the node (else it was there: never remove it)
    v1_added: bool = False  # we wrote its devices.allow line (else the runtime had it)


class DriverFileRecord(BaseModel):
    """One driver file added to a container (hotmount/driver/): a read-only bind mount
    of a host file, or a symlink. `created`: we made it (else it was there: keep it)."""

    path: str
    kind: str
    source: str
    source_root: str = "/"
    created: bool = True
    # What was bound (a bind, once placed): the source's st_dev/st_ino then, and the
    # mount's ID in the container. Unmount and repair compare with these, not with the
    # host's file now: after a driver upgrade replaced it, the bind is still ours.
    source_dev: int | None = None
    source_ino: int | None = None
    mnt_id: int | None = None


class DeviceRecord(BaseModel):
    key: str
    kind: str
    node_paths: list[str]
    mounted_at: str
    metadata: dict[str, str] = Field(default_factory=dict)  # the caller's labels: opaque
    workload: Workload | None = None  # whom it was mounted for (named in a refusal)

    @model_validator(mode="before")
    @classmethod
    def _workload_of_older_records(cls, data: Any) -> Any:
        """Records saved before `workload` existed carried it as the labels `namespace`,
        `pod` and `container` (the agent's, which it still sets): read once from there, so
        a GPU mounted before an upgrade still names its pod when it refuses another."""
        if isinstance(data, dict) and "workload" not in data:
            labels = data.get("metadata") or {}
            if isinstance(labels, dict) and labels.get("pod"):
                data = {**data, "workload": _workload(labels)}
        return data

    group: str | None = None  # who may share it without asking (see hotmount/state/claims.py)
    shared_with: str | None = None  # the group it joined on purpose
    with_devices: list[str] = Field(default_factory=list)  # RDMA: the GPUs it came with


class PendingOp(BaseModel):
    op: Literal["mount", "unmount"]
    devices: list[str]
    nodes: list[NodeRecord]  # nodes the operation creates or removes
    driver: list[DriverFileRecord] = Field(default_factory=list)  # driver files, likewise


class CudaProcess(BaseModel):
    """A process a suspension checkpoints: its host PID and start time (a PID reused
    since is not it), and the GPU memory NVML said it held. `container_pid`: its PID in
    the container's own PID namespace, the one results name (the host's is the node's,
    not the tenant's to know); None for a process of another PID namespace, or one
    recorded before it was kept."""

    pid: int
    start_time: int
    gpu_bytes: int = 0
    container_pid: int | None = None


class SuspendedGpu(BaseModel):
    """A GPU taken away by a suspension: the record it had, to be mounted again as it was."""

    device: DeviceRecord
    uuid: str
    model: str | None = None
    suspended_at: str


class Suspension(BaseModel):
    """A suspend or resume under way (hotmount/engine/suspension.py): written before each step,
    so that reconcile finishes it or rolls it back and leaves no process locked."""

    op: Literal["suspend", "resume"]
    step: str  # suspend: locking, checkpointing, unmounting; resume: mounting, restoring
    devices: list[str]  # the suspended GPUs' keys
    processes: list[CudaProcess]
    targets: dict[str, str] = Field(default_factory=dict)  # resume: old key -> new key


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
    driver: list[DriverFileRecord] = Field(default_factory=list)  # go with the last device
    driver_env: dict[str, str] = Field(default_factory=dict)
    suspended: dict[str, SuspendedGpu] = Field(default_factory=dict)  # by the old key
    suspended_processes: list[CudaProcess] = Field(default_factory=list)
    suspension: Suspension | None = None


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


_SAFE = re.compile(r"[^A-Za-z0-9_.-]")


@functools.lru_cache(maxsize=8192)
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
        # Plain strings for the per-operation paths: pathlib costs more than the syscalls.
        self._containers_dir = os.fspath(self._containers)
        self._claims_dir = os.fspath(self._claims)
        self._locks_dir = os.fspath(self._locks)
        self._claim_cache: dict[bytes, Claim] = {}

    def _record_path(self, key: str) -> str:
        return f"{self._containers_dir}/{_file_name(key)}.json"

    # -- records
    def load(self, key: str) -> ContainerRecord | None:
        return _parse(self._record_path(key))

    def save(self, record: ContainerRecord) -> None:
        path = self._record_path(record.key)
        kept = record.devices or record.pending or record.nodes or record.driver
        if not (kept or record.suspended or record.suspension):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            return
        atomic_write(path, record.model_dump_json().encode())

    def delete(self, key: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._record_path(key))

    def records(self) -> list[ContainerRecord]:
        names = sorted(n for n in os.listdir(self._containers_dir) if n.endswith(".json"))
        records = (_parse(os.path.join(self._containers_dir, n)) for n in names if n[0] != ".")
        return [record for record in records if record is not None]

    # -- per-container operation lock
    @contextlib.contextmanager
    def lock(self, key: str) -> Iterator[None]:
        path = f"{self._locks_dir}/{_file_name(key)}.lock"
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    @contextlib.contextmanager
    def try_lock(self, key: str) -> Iterator[bool]:
        """`lock` without waiting: yields False (and holds nothing) while another holds it."""
        path = f"{self._locks_dir}/{_file_name(key)}.lock"
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                yield False
                return
            yield True
        finally:
            os.close(fd)

    # -- device claims
    @contextlib.contextmanager
    def claims_lock(self) -> Iterator[None]:
        """Held only while claims are read, checked and written: never across kernel work."""
        with self.lock(".claims"):
            yield

    def claim_path(self, owner: str, device_key: str) -> Path:
        return Path(self._claim_file(owner, device_key))

    def _claim_file(self, owner: str, device_key: str) -> str:
        return f"{self._claims_dir}/{_file_name(owner)}@{_file_name(device_key)}"

    def claims(self) -> list[Claim]:
        """Every claim on disk. One that does not parse (empty, cut short) holds everything:
        it never reads as free. Its owner is in its file name, so reconcile can repair it.

        Every file is read on every call (another process may have written it), but a
        content seen before is not parsed again: the cache is keyed by the bytes read.
        """
        out = []
        cache = self._claim_cache
        for name in sorted(os.listdir(self._claims_dir)):
            if name.startswith("."):
                continue  # a temp file not yet linked into place: no claim
            data = _read_bytes(f"{self._claims_dir}/{name}")
            if data is None:
                continue
            claim = cache.get(data)
            if claim is None:
                try:
                    claim = _claim_of(ClaimRecord.model_validate_json(data))
                except ValueError:
                    owner = name.partition("@")[0]
                    out.append(
                        Claim(owner=owner, device=f"?{name}", group=owner, footprint=UNKNOWN)
                    )
                    continue
                if len(cache) > 4096:
                    cache.clear()
                cache[data] = claim
            out.append(claim)
        return out

    def add_claims(self, claims: list[Claim]) -> None:
        """Write each claim whole into a temp file, then link it into place (call under
        `claims_lock`). A reader sees no file or a complete one, never an empty claim."""
        for claim in claims:
            _link_into_place(self._claim_file(claim.owner, claim.device), _claim_bytes(claim))

    def release(self, device_key: str, owner: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._claim_file(owner, device_key))

    def release_unreadable(self, owner: str) -> None:
        """Drop `owner`'s claim files that do not parse (call under `claims_lock`)."""
        for path in self._claims.glob(f"{_file_name(owner)}@*"):
            try:
                ClaimRecord.model_validate_json(path.read_bytes())
            except FileNotFoundError:
                continue
            except ValueError:
                path.unlink(missing_ok=True)

    def sweep_temp_claims(self) -> None:
        """Temp files a crashed writer left behind (call under `claims_lock`)."""
        for path in self._claims.glob(".*"):
            path.unlink(missing_ok=True)


class ClaimRecord(BaseModel):
    version: int = CLAIM_VERSION
    owner: str
    device: str
    group: str
    shared_with: str | None = None
    exclusive: list[tuple[int, int]]
    touched: list[tuple[int, int]]
    holder: dict[str, str] = Field(default_factory=dict)


def _claim_bytes(claim: Claim) -> bytes:
    return (
        ClaimRecord(
            owner=claim.owner,
            device=claim.device,
            group=claim.group,
            shared_with=claim.shared_with,
            exclusive=sorted(claim.footprint.exclusive),
            touched=sorted(claim.footprint.touched),
            holder=claim.holder.fields() if claim.holder else {},
        )
        .model_dump_json()
        .encode()
    )


def _claim_of(record: ClaimRecord) -> Claim:
    return Claim(
        owner=record.owner,
        device=record.device,
        group=record.group,
        footprint=Footprint(frozenset(record.exclusive), frozenset(record.touched)),
        shared_with=record.shared_with,
        holder=_workload(record.holder),
    )


def _workload(fields: dict[str, str]) -> Workload | None:
    known = {k: v for k, v in fields.items() if k in ("namespace", "pod", "container")}
    return Workload(**known) if known else None


def _temp_beside(path: str) -> str:
    """A temp name beside `path`, its own for this process and thread (no random names:
    the writers of one name are serialized by a lock, and no two threads share a temp).
    It starts with a dot: readers skip it, `sweep_temp_claims` removes a crashed one."""
    directory, name = os.path.split(path)
    return os.path.join(directory, f".{name[:80]}.{os.getpid()}.{threading.get_ident()}")


def _write_new(tmp: str, data: bytes) -> None:
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)


def _read_bytes(path: str) -> bytes | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    try:
        chunks = []
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def _link_into_place(path: str, data: bytes) -> None:
    """Temp file, then link(2): the name appears only with its whole content behind it."""
    tmp = _temp_beside(path)
    try:
        _write_new(tmp, data)
        try:
            os.link(tmp, path)
        except FileExistsError:
            os.replace(tmp, path)  # rewriting our own claim: the same owner and device
    except OSError as exc:
        raise KernelError(f"writing the claim {path}: {exc.strerror}") from exc
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def _parse(path: str) -> ContainerRecord | None:
    try:
        data = _read_bytes(path)
        if data is None:
            return None
        return ContainerRecord.model_validate_json(data)
    except ValueError as exc:  # pydantic's ValidationError is a ValueError
        log.warning("ignoring unreadable ledger record %s: %s", path, exc)
        return None


def atomic_write(path: str, data: bytes) -> None:
    """`data` at `path` whole or not at all: a temp file of its own beside it, renamed."""
    tmp = _temp_beside(path)
    try:
        _write_new(tmp, data)
        os.replace(tmp, path)
    except OSError as exc:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise KernelError(f"writing the ledger {path}: {exc.strerror}") from exc
