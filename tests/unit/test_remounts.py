"""Which dead containers' devices are kept for a successor, which holders that keeps, and
the agent's own store of them (agent/common/intents.py)."""

from __future__ import annotations

import ast
from pathlib import Path

from agent.common.intents import Intent, Intents, file_name, named_holders
from agent.node.remounts import owner_of
from hotmount.state.ledger import ContainerRecord, DeviceRecord

REPO = Path(__file__).resolve().parents[2]


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


def intent(key: str, **metadata: str) -> Intent:
    return Intent(key=key, owner={"pod": "nb"}, devices=record(**metadata).devices, saved_at="t")


def test_the_store_keeps_saves_and_deletes_by_key(tmp_path: Path) -> None:
    store = Intents(tmp_path)
    store.save(intent("u-1/main", namespace="ml", holder="pin-1"))
    store.save(intent("u-2/main", namespace="ml", holder="pin-2"))
    store.save(intent("u-1/main", namespace="ml", holder="pin-3"))  # replaces, not a second
    assert sorted(i.key for i in store.all()) == ["u-1/main", "u-2/main"]
    assert store.named_holders() == {("ml", "pin-2"), ("ml", "pin-3")}
    store.delete("u-1/main")
    store.delete("u-9/none")  # nothing there: nothing to do
    assert [i.key for i in Intents(tmp_path).all()] == ["u-2/main"]  # read by a new agent


def test_an_older_agents_intent_files_are_renamed_once_and_read(tmp_path: Path) -> None:
    """The engine's ledger kept intents in the same directory, named after the key."""
    old = tmp_path / "intents"
    old.mkdir()
    (old / "u-1_main-0123456789ab.json").write_text(intent("u-1/main").model_dump_json())
    (old / "garbage.json").write_text("{not json")
    store = Intents(tmp_path)
    assert [i.key for i in store.all()] == ["u-1/main"]
    assert {p.name for p in old.iterdir()} == {"garbage.json", file_name("u-1/main")}


def test_the_agent_never_reaches_into_the_engines_ledger() -> None:
    """The engine's public API (hotmount/api.py) is all the agent and the CLI use: no
    attribute `ledger` is read anywhere in them (import-linter holds the imports)."""
    reaching = []
    for path in sorted([*REPO.glob("agent/**/*.py"), *REPO.glob("cli/**/*.py")]):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr == "ledger":
                reaching.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert reaching == []
