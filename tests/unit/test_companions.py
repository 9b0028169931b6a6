"""Which RDMA devices leave with which GPUs: pure rules over a ledger record."""

from __future__ import annotations

from hotmount.devices.companions import leaving_with, note
from hotmount.devices.model import Device, DeviceKind
from hotmount.state.ledger import ContainerRecord, DeviceRecord


def record(**with_devices: list[str]) -> ContainerRecord:
    r = ContainerRecord(
        key="c", container_id=None, init_pid=1, init_start_time=1, v1_dir=None, v2_dir=None
    )
    for key in ("g0", "g1"):
        r.devices[key] = DeviceRecord(key=key, kind="gpu", node_paths=[], mounted_at="t")
    for key, along in with_devices.items():
        r.devices[key] = DeviceRecord(
            key=key, kind="rdma", node_paths=[], mounted_at="t", with_devices=along
        )
    return r


def test_a_nic_leaves_with_the_last_gpu_it_came_with() -> None:
    r = record(nic0=["g0"], nic1=["g0", "g1"], own=[])
    assert leaving_with(r, ["g0"]) == ["g0", "nic0"]
    assert sorted(leaving_with(r, ["g0", "g1"])) == ["g0", "g1", "nic0", "nic1"]
    # One mounted on its own never leaves unless named.
    assert "own" not in leaving_with(r, ["g0", "g1"])


def test_a_gpu_already_gone_does_not_keep_its_nic() -> None:
    r = record(nic1=["g0", "gone"])
    assert leaving_with(r, ["g0"]) == ["g0", "nic1"]


def test_note_extends_only_riders() -> None:
    r = record(nic0=["g0"], own=[])
    nic = Device("nic0", DeviceKind.RDMA, ())
    own = Device("own", DeviceKind.RDMA, ())
    note(r, {"nic0": (nic, ["g1"]), "own": (own, ["g1"])})
    assert r.devices["nic0"].with_devices == ["g0", "g1"]
    assert r.devices["own"].with_devices == []
