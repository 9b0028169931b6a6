"""The ledger: atomic per-container records and linked-into-place claims, in a tmp state dir."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from hotmount.state.claims import Claim, Footprint, Workload, claimed_error
from hotmount.state.ledger import (
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
        ledger.add_claims([claim("GPU-1", CID, group=f"pod-{i}")])
    assert listing(ledger.state_dir / "containers") == [f"{CID}.json"]
    assert listing(ledger.state_dir / "claims") == [f"{CID}@GPU-1"]
    loaded = ledger.load(CID)
    assert loaded is not None
    assert loaded.init_pid == 104
    assert [c.group for c in ledger.claims()] == ["pod-4"]


def test_state_dirs_are_private(ledger: Ledger) -> None:
    for name in ("containers", "claims", "locks"):
        assert (ledger.state_dir / name).stat().st_mode & 0o077 == 0


def test_a_second_ledger_on_the_same_dir_sees_the_records(ledger: Ledger) -> None:
    ledger.save(record())
    ledger.add_claims([claim("GPU-1", CID)])
    again = Ledger(ledger.state_dir)
    assert again.load(CID) == record()
    assert again.claims() == [claim("GPU-1", CID)]


# -- claims: one file per (container, device), written whole, then linked into place


def claim(device: str, owner: str, group: str = "default/nb", minor: int = 0) -> Claim:
    numbers = frozenset({(195, minor)})
    return Claim(owner, device, group, Footprint(numbers, numbers), holder=Workload(pod="nb"))


def test_claims_round_trip_with_their_footprint(ledger: Ledger) -> None:
    mine = Claim(
        CID,
        "MIG-GPU-1/1/0",
        "default/nb",
        Footprint(frozenset({(240, 12)}), frozenset({(240, 12), (195, 0)})),
        shared_with="default/producer",
        holder=Workload("default", "nb", "main"),
    )
    ledger.add_claims([mine, claim("GPU-2", OTHER, minor=1)])
    assert sorted(ledger.claims(), key=lambda c: c.owner) == [mine, claim("GPU-2", OTHER, minor=1)]


def test_release_only_drops_that_owners_claim(ledger: Ledger) -> None:
    ledger.add_claims([claim("GPU-1", CID), claim("GPU-1", OTHER)])
    ledger.release("GPU-1", OTHER)
    assert ledger.claims() == [claim("GPU-1", CID)]
    ledger.release("GPU-2", CID)  # releasing what nobody holds is fine
    assert ledger.claims() == [claim("GPU-1", CID)]


@pytest.mark.parametrize("content", [b"", b'{"version": 2, "owner": "aa', b"{not json"])
def test_an_empty_or_cut_short_claim_file_never_reads_as_free(
    ledger: Ledger, content: bytes
) -> None:
    # What a crash between create and write left with the old O_EXCL-then-write claim.
    ledger.claim_path(CID, "GPU-1").write_bytes(content)

    [held] = ledger.claims()

    assert held.owner == CID and held.footprint.unknown
    # It holds every physical device until reconcile rewrites it from the record.
    assert held.footprint.overlaps(claim("GPU-9", OTHER, minor=9).footprint)
    ledger.release_unreadable(CID)
    assert ledger.claims() == []


def test_a_claim_read_before_then_cut_short_in_place_never_reads_as_its_old_self(
    ledger: Ledger,
) -> None:
    """Claims are parsed once per content: a file rewritten in place under the same name
    and inode (same length even) is read again and judged by what it holds now."""
    ledger.add_claims([claim("GPU-1", CID)])
    assert ledger.claims() == [claim("GPU-1", CID)]  # parsed and cached
    path = ledger.claim_path(CID, "GPU-1")
    inode, size = path.stat().st_ino, path.stat().st_size
    with path.open("r+b") as f:  # garbage of the same length, same inode
        f.write(b"\0" * size)
    assert (path.stat().st_ino, path.stat().st_size) == (inode, size)

    [held] = ledger.claims()

    assert held.owner == CID and held.footprint.unknown


def test_a_claim_written_by_another_ledger_is_seen_at_once(ledger: Ledger) -> None:
    """Nothing about the claims is kept between calls but parsed contents: a second
    process (the CLI beside the agent) writing a claim is seen by the next read."""
    assert ledger.claims() == []
    Ledger(ledger.state_dir).add_claims([claim("GPU-1", OTHER)])
    assert ledger.claims() == [claim("GPU-1", OTHER)]


def test_temp_files_of_a_crashed_writer_are_no_claim_and_are_swept(ledger: Ledger) -> None:
    (ledger.state_dir / "claims" / f".{CID}@GPU-1.x1y2").write_bytes(b"")
    assert ledger.claims() == []
    ledger.sweep_temp_claims()
    assert listing(ledger.state_dir / "claims") == []


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
        ledger.add_claims([claim(key, f"owner-{i}")])
        rec = record(key)
        ledger.save(rec)
        assert ledger.load(key) == rec
    claim_files = listing(ledger.state_dir / "claims")
    assert len(claim_files) == len(AWKWARD_KEYS)
    assert len(listing(ledger.state_dir / "containers")) == len(AWKWARD_KEYS)
    for name in claim_files:
        data = json.loads((ledger.state_dir / "claims" / name).read_text())
        assert f"{_file_name(data['owner'])}@{_file_name(data['device'])}" == name
    assert sorted(os.listdir(ledger.state_dir)) == ["claims", "containers", "locks"]


def test_a_device_keeps_whom_it_was_mounted_for_apart_from_its_labels() -> None:
    """The engine's typed `workload` is what a refusal names; the caller's labels are
    opaque. A record saved before `workload` existed (the agent's labels named the pod)
    reads with the workload those labels gave, once; a bare container's has none."""
    labels = {"namespace": "ml", "pod": "nb", "container": "main", "holder": "pin-1"}
    older = {"key": "GPU-1", "kind": "gpu", "node_paths": [], "mounted_at": "t", "metadata": labels}
    assert DeviceRecord.model_validate(older).workload == Workload("ml", "nb", "main")
    bare = {**older, "metadata": {"container_id": "c1"}}
    assert DeviceRecord.model_validate(bare).workload is None
    now_saved = DeviceRecord.model_validate({**older, "workload": None, "metadata": labels})
    assert now_saved.workload is None  # saved with its own field: the labels are not read
    typed = DeviceRecord(
        key="GPU-1", kind="gpu", node_paths=[], mounted_at="t", workload=Workload(pod="x")
    )
    assert DeviceRecord.model_validate_json(typed.model_dump_json()) == typed


def test_a_refusal_names_the_workload_and_never_the_labels() -> None:
    numbers = frozenset({(195, 0)})
    held = Claim(
        "c1", "GPU-1", "ml/nb", Footprint(numbers, numbers), None, Workload("ml", "nb", "m")
    )
    bare = Claim("c2", "GPU-1", "c2", Footprint(numbers, numbers))
    assert "pod ml/nb (container m" in claimed_error(None, [held]).message
    assert claimed_error(None, [held]).holders[0] == {
        "containerId": "c1", "device": "GPU-1", "namespace": "ml", "pod": "nb", "container": "m",
    }  # fmt: skip
    assert claimed_error(None, [bare]).message.startswith("device GPU-1 is the same physical")
    assert "container c2 as GPU-1" in claimed_error(None, [bare]).message
