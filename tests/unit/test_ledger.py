"""The ledger: atomic per-container records and O_EXCL device claims, in a tmp state dir."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from hotmount.ledger import (
    ContainerRecord,
    DeviceRecord,
    Ledger,
    NodeRecord,
    PendingOp,
    _file_name,
)

CID = "a" * 64
OTHER = "b" * 64


def node(path: str = "/dev/nvidia0", minor: int = 0) -> NodeRecord:
    return NodeRecord(
        path=path, major=195, minor=minor, file_mode=0o666, permissions="rw", created=True,
        v1_added=True,
    )  # fmt: skip


def record(key: str = CID, *, devices: bool = True, pending: bool = False) -> ContainerRecord:
    rec = ContainerRecord(
        key=key, container_id=key, init_pid=4242, init_start_time=123456789,
        v1_dir=None, v2_dir="/sys/fs/cgroup/kubepods.slice/x.scope",
    )  # fmt: skip
    if devices:
        rec.nodes = {"/dev/nvidia0": node(), "/dev/nvidiactl": node("/dev/nvidiactl", 255)}
        rec.devices = {
            "GPU-1": DeviceRecord(
                key="GPU-1", kind="gpu", node_paths=["/dev/nvidia0", "/dev/nvidiactl"],
                mounted_at="2024-05-01T12:00:00+00:00", metadata={"caller": "alice"},
            )
        }  # fmt: skip
    if pending:
        rec.pending = PendingOp(op="mount", devices=["GPU-2"], nodes=[node("/dev/nvidia1", 1)])
    return rec


@pytest.fixture
def ledger(tmp_path: Path) -> Ledger:
    return Ledger(tmp_path / "state")


def listing(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


# -- records


@pytest.mark.parametrize(
    "rec",
    [record(), record(pending=True), record(devices=False, pending=True), record("pid-4242")],
    ids=["devices", "devices-and-pending", "pending-only", "pid-key"],
)
def test_save_load_round_trip(ledger: Ledger, rec: ContainerRecord) -> None:
    ledger.save(rec)
    assert ledger.load(rec.key) == rec
    assert ledger.records() == [rec]


def test_load_of_unknown_key_is_none(ledger: Ledger) -> None:
    assert ledger.load(CID) is None
    assert ledger.records() == []


def test_save_overwrites(ledger: Ledger) -> None:
    ledger.save(record())
    changed = record()
    changed.devices["GPU-1"].metadata["caller"] = "bob"
    ledger.save(changed)
    loaded = ledger.load(CID)
    assert loaded is not None
    assert loaded.devices["GPU-1"].metadata == {"caller": "bob"}


def test_saving_an_empty_record_deletes_it(ledger: Ledger) -> None:
    ledger.save(record())
    assert listing(ledger.state_dir / "containers") == [f"{CID}.json"]
    ledger.save(record(devices=False))
    assert ledger.load(CID) is None
    assert listing(ledger.state_dir / "containers") == []
    ledger.save(record(devices=False))  # and again: nothing to delete is fine
    assert ledger.records() == []


def test_delete(ledger: Ledger) -> None:
    ledger.save(record())
    ledger.save(record(OTHER))
    ledger.delete(CID)
    ledger.delete(CID)
    assert [r.key for r in ledger.records()] == [OTHER]


def test_atomic_writes_leave_no_temp_files(ledger: Ledger) -> None:
    for i in range(5):
        rec = record()
        rec.init_pid = 100 + i
        ledger.save(rec)
        ledger.take_over("GPU-1", f"owner-{i}")
    assert listing(ledger.state_dir / "containers") == [f"{CID}.json"]
    assert listing(ledger.state_dir / "claims") == ["GPU-1"]
    loaded = ledger.load(CID)
    assert loaded is not None
    assert loaded.init_pid == 104


def test_state_dirs_are_private(ledger: Ledger) -> None:
    for name in ("containers", "claims", "locks"):
        assert (ledger.state_dir / name).stat().st_mode & 0o077 == 0


def test_a_second_ledger_on_the_same_dir_sees_the_records(ledger: Ledger) -> None:
    ledger.save(record())
    ledger.claim("GPU-1", CID)
    again = Ledger(ledger.state_dir)
    assert again.load(CID) == record()
    assert again.claims() == {"GPU-1": CID}


# -- claims


def test_claim_is_exclusive(ledger: Ledger) -> None:
    assert ledger.claim("GPU-1", CID) is None
    assert ledger.claim("GPU-1", OTHER) == CID
    assert ledger.claim_owner("GPU-1") == CID


def test_claim_by_the_same_owner_is_idempotent(ledger: Ledger) -> None:
    assert ledger.claim("GPU-1", CID) is None
    assert ledger.claim("GPU-1", CID) is None
    assert ledger.claims() == {"GPU-1": CID}


def test_release_only_by_the_owner(ledger: Ledger) -> None:
    ledger.claim("GPU-1", CID)
    ledger.release("GPU-1", OTHER)
    assert ledger.claim_owner("GPU-1") == CID
    ledger.release("GPU-1", CID)
    assert ledger.claim_owner("GPU-1") is None
    assert ledger.claim("GPU-1", OTHER) is None
    ledger.release("GPU-2", CID)  # releasing what nobody holds is fine
    assert ledger.claims() == {"GPU-1": OTHER}


def test_take_over(ledger: Ledger) -> None:
    ledger.claim("GPU-1", CID)
    ledger.take_over("GPU-1", OTHER)
    assert ledger.claim_owner("GPU-1") == OTHER
    assert ledger.claim("GPU-1", CID) == OTHER
    ledger.release("GPU-1", CID)
    assert ledger.claim_owner("GPU-1") == OTHER


def test_take_over_of_an_unclaimed_device(ledger: Ledger) -> None:
    ledger.take_over("GPU-1", OTHER)
    assert ledger.claims() == {"GPU-1": OTHER}


def test_claims_lists_every_device_by_its_real_key(ledger: Ledger) -> None:
    keys = {
        "GPU-1": CID,
        "MIG-GPU-1/1/0": OTHER,
        "nvidia.com/gpu=0": "pid-4242",
        "example.com/nic=mlx5_0:1": CID,
    }
    for key, owner in keys.items():
        assert ledger.claim(key, owner) is None
    assert ledger.claims() == keys
    for key, owner in keys.items():
        assert ledger.claim_owner(key) == owner


def test_a_corrupt_claim_file_counts_as_unowned(ledger: Ledger) -> None:
    ledger.claim("GPU-1", CID)
    (ledger.state_dir / "claims" / "GPU-1").write_text("{not json")
    assert ledger.claim_owner("GPU-1") is None
    assert ledger.claims() == {}
    # The file still exists, so O_EXCL still refuses, but nobody holds it: the caller may go on.
    assert ledger.claim("GPU-1", OTHER) is None


# -- file names

AWKWARD_KEYS = [
    "nvidia.com/gpu=0",
    "nvidia.com/gpu_0",
    "nvidia.com_gpu=0",
    "nvidia.com_gpu_0",
    "MIG-GPU-1/1/0",
    "MIG-GPU-1_1_0",
    "MIG-GPU-1/1_0",
    "example.com/nic=mlx5_0:1",
    "example.com/nic=mlx5_0_1",
    "x/" + "y" * 200,
    "x=" + "y" * 200,
]


def test_file_names_are_unique_and_safe() -> None:
    names = [_file_name(key) for key in AWKWARD_KEYS]
    assert len(set(names)) == len(names)
    for name in names:
        assert "/" not in name
        assert "=" not in name
        assert name not in ("", ".", "..")
        assert len(name) <= 100


@pytest.mark.parametrize("key", ["GPU-1", CID, "pid-4242"], ids=["uuid", "container", "pid"])
def test_plain_keys_keep_their_names(key: str) -> None:
    assert _file_name(key) == key


def test_awkward_keys_stay_inside_the_state_dir(ledger: Ledger) -> None:
    for i, key in enumerate(AWKWARD_KEYS):
        assert ledger.claim(key, f"owner-{i}") is None
        rec = record(key)
        ledger.save(rec)
        assert ledger.load(key) == rec
    claim_files = listing(ledger.state_dir / "claims")
    assert len(claim_files) == len(AWKWARD_KEYS)
    assert len(listing(ledger.state_dir / "containers")) == len(AWKWARD_KEYS)
    for name in claim_files:
        data = json.loads((ledger.state_dir / "claims" / name).read_text())
        assert _file_name(data["device"]) == name
    assert sorted(os.listdir(ledger.state_dir)) == ["claims", "containers", "locks"]
