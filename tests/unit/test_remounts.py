"""Which dead containers' devices are kept for a successor, and which holders that keeps."""

from __future__ import annotations

from agent.books.holders import named_holders
from agent.node.remounts import owner_of
from hotmount.state.ledger import ContainerRecord, DeviceRecord, Intent


def record(**metadata: str) -> ContainerRecord:
    device = DeviceRecord(
        key="GPU-a", kind="gpu", node_paths=["/dev/nvidia0"], mounted_at="t", metadata=metadata
    )
    return ContainerRecord(
        key="c1", container_id="c1", init_pid=1, init_start_time=1, v1_dir=None, v2_dir=None,
        devices={"GPU-a": device},
    )  # fmt: skip


def test_a_pods_container_is_kept_by_uid_and_name() -> None:
    owner = owner_of(record(namespace="ml", pod="nb", podUid="u-1", container="main", holder="p"))
    assert owner == {
        "namespace": "ml", "pod": "nb", "podUid": "u-1", "container": "main", "containerId": "c1",
    }  # fmt: skip


def test_standalone_containers_and_mounts_without_a_pod_uid_are_not_kept() -> None:
    assert owner_of(record(container_id="c1")) is None
    assert owner_of(record(namespace="ml", pod="nb", container="main")) is None  # before podUid


def test_an_intent_names_its_pins_and_holders() -> None:
    devices = record(namespace="ml", pod="nb", podUid="u", container="m", holder="pin-1").devices
    intent = Intent(key="u/m", owner={}, devices=devices, saved_at="t")
    assert named_holders([intent]) == {("ml", "pin-1")}
