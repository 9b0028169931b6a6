"""One physical device, one claim: every name of a GPU meets at its major:minor.

A CDI spec as nvidia-ctk writes it names stand-in GPU 0 (/dev/nvidia0, 195:0) three
ways (`=0`, `=GPU-<uuid>`, `=all`) and carves two MIG instances from it. Whatever
name container A mounted it under, container B gets 409 under every other name,
and nothing changes in B: no grant, no node, no record.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from hotmount.engine.core import Engine, EngineConfig
from hotmount.errors import DeviceClaimed
from hotmount.state.claims import Workload
from tests.kernel.test_bad_input import _kernel_view
from tests.support.runc import RuncContainer

UUID = "GPU-0a0a0a0a-0000-4000-8000-000000000000"
CAPS = 239  # a stand-in nvidia-caps major: the instances' capability nodes
ALIASED_SPEC = f"""\
cdiVersion: 0.6.0
kind: nvidia.com/gpu
devices:
  - name: "0"
    containerEdits:
      deviceNodes: [{{path: /dev/nvidia0, type: c, major: 195, minor: 0}}]
  - name: {UUID}
    containerEdits:
      deviceNodes: [{{path: /dev/nvidia0, type: c, major: 195, minor: 0}}]
  - name: "1"
    containerEdits:
      deviceNodes: [{{path: /dev/nvidia1, type: c, major: 10, minor: 229}}]
  - name: "0:1"
    containerEdits:
      deviceNodes:
        - {{path: /dev/nvidia0, type: c, major: 195, minor: 0}}
        - {{path: /dev/nvidia-caps/nvidia-cap21, type: c, major: {CAPS}, minor: 21}}
        - {{path: /dev/nvidia-caps/nvidia-cap22, type: c, major: {CAPS}, minor: 22}}
  - name: "0:2"
    containerEdits:
      deviceNodes:
        - {{path: /dev/nvidia0, type: c, major: 195, minor: 0}}
        - {{path: /dev/nvidia-caps/nvidia-cap30, type: c, major: {CAPS}, minor: 30}}
        - {{path: /dev/nvidia-caps/nvidia-cap31, type: c, major: {CAPS}, minor: 31}}
  - name: all
    containerEdits:
      deviceNodes:
        - {{path: /dev/nvidia0, type: c, major: 195, minor: 0}}
        - {{path: /dev/nvidia1, type: c, major: 10, minor: 229}}
containerEdits:
  deviceNodes:
    - {{path: /dev/nvidiactl, type: c, major: 195, minor: 255}}
"""
GPU0, ALIAS, MIG1, MIG2, ALL = (
    "nvidia.com/gpu=0",
    f"nvidia.com/gpu={UUID}",
    "nvidia.com/gpu=0:1",
    "nvidia.com/gpu=0:2",
    "nvidia.com/gpu=all",
)


@pytest.fixture
def engine(tmp_path: Path, state_dir: Path) -> Engine:
    cdi_dir = tmp_path / "aliased-cdi"
    cdi_dir.mkdir()
    (cdi_dir / "nvidia.yaml").write_text(ALIASED_SPEC)
    return Engine(
        EngineConfig(cdi_dirs=(str(cdi_dir),), state_dir=state_dir, use_nvml=False, stop_grace=2)
    )


Make = Callable[[str], RuncContainer]


@pytest.mark.parametrize(
    ("held", "asked"),
    [
        (GPU0, ALIAS),
        (ALIAS, "nvidia.com/gpu=0"),
        (GPU0, ALL),
        (ALL, GPU0),
        (GPU0, MIG1),
        (MIG1, GPU0),
        (MIG1, ALL),
    ],
    ids=["index-then-uuid", "uuid-then-index", "gpu-then-all", "all-then-gpu",
         "gpu-then-mig", "mig-then-parent", "mig-then-all"],
)  # fmt: skip
def test_another_name_of_a_held_gpu_is_refused_and_nothing_changes(
    engine: Engine, make_container: Make, mode: str, held: str, asked: str
) -> None:
    a, b = make_container(mode), make_container(mode)
    # The refusal names the typed workload; the caller's labels are opaque to the engine.
    labels = {"namespace": "decoy", "pod": "decoy"}
    engine.mount(a.id, [held], metadata=labels, workload=Workload("team-a", "a", "main"))
    before = _kernel_view(b)

    with pytest.raises(DeviceClaimed) as refused:
        engine.mount(b.id, [asked])

    assert "team-a/a" in refused.value.message and a.id[:12] in refused.value.message
    assert "decoy" not in refused.value.message
    assert [h["pod"] for h in refused.value.holders] == ["a"]
    assert _kernel_view(b) == before and engine.ledger.load(b.id) is None
    assert {c.owner for c in engine.ledger.claims()} == {a.id}
    assert a.open_result("/dev/nvidia0") == "ENXIO"  # A keeps it


def test_cdi_aliases_fold_into_one_device(engine: Engine) -> None:
    device = engine.inventory.resolve(ALIAS)
    assert device.key == GPU0 and ALIAS in device.aliases
    assert [d.key for d in engine.inventory.devices].count(GPU0) == 1
    assert ALIAS not in [d.key for d in engine.inventory.devices]


def test_two_mig_instances_of_one_gpu_do_not_collide(engine: Engine, make_container: Make) -> None:
    a, b = make_container("v2"), make_container("v1")
    engine.mount(a.id, [MIG1])
    engine.mount(b.id, [MIG2])

    assert a.open_result("/dev/nvidia-caps/nvidia-cap21") == "ENXIO"
    assert b.open_result("/dev/nvidia-caps/nvidia-cap30") == "ENXIO"
    held = engine.holders()
    assert {c.owner for c in held[GPU0]} == {a.id, b.id}  # the parent shows both
    assert {c.owner for c in held[MIG1]} == {a.id}


def test_in_use_view_is_physical(engine: Engine, make_container: Make) -> None:
    a = make_container("v1")
    engine.mount(a.id, [ALL])
    held = engine.holders()
    assert {key: [c.owner for c in claims] for key, claims in held.items()} == {
        GPU0: [a.id],
        "nvidia.com/gpu=1": [a.id],
        MIG1: [a.id],
        MIG2: [a.id],
        ALL: [a.id],
    }


def test_containers_of_one_pod_share_without_force(
    engine: Engine, make_container: Make, mode: str
) -> None:
    a, b, other = make_container(mode), make_container(mode), make_container(mode)
    engine.mount(a.id, [GPU0], group="ml/producer")
    engine.mount(b.id, [ALIAS], group="ml/producer")

    assert a.open_result("/dev/nvidia0") == b.open_result("/dev/nvidia0") == "ENXIO"
    with pytest.raises(DeviceClaimed):
        engine.mount(other.id, [GPU0], group="ml/consumer")


def test_sharing_across_pods_only_on_purpose(engine: Engine, make_container: Make) -> None:
    producer, consumer, third = (make_container("v1") for _ in range(3))
    engine.mount(producer.id, [GPU0], group="ml/producer")

    engine.mount(consumer.id, [GPU0], group="ml/consumer", share_with="ml/producer")

    assert consumer.open_result("/dev/nvidia0") == "ENXIO"
    assert {c.owner for c in engine.holders()[GPU0]} == {producer.id, consumer.id}
    # Never further by accident: a third pod that names no holder is refused...
    with pytest.raises(DeviceClaimed) as refused:
        engine.mount(third.id, [GPU0], group="ml/third")
    assert {h["containerId"] for h in refused.value.holders} == {producer.id, consumer.id}
    with pytest.raises(DeviceClaimed):
        engine.mount(third.id, [GPU0], group="ml/third", share_with="ml/somebody-else")
    # ... and a link made for GPU 0 opens no other GPU.
    engine.mount(producer.id, ["nvidia.com/gpu=1"], group="ml/producer")
    with pytest.raises(DeviceClaimed):
        engine.mount(consumer.id, ["nvidia.com/gpu=1"], group="ml/consumer")
    # Naming any current holder is on purpose.
    engine.mount(third.id, [GPU0], group="ml/third", share_with="ml/consumer")
    assert third.open_result("/dev/nvidia0") == "ENXIO"


def test_an_empty_claim_file_never_reads_as_free(engine: Engine, make_container: Make) -> None:
    a, b = make_container("v1"), make_container("v2")
    engine.mount(a.id, [GPU0])
    # As a crash between creating and writing a claim left it.
    engine.ledger.claim_path(a.id, GPU0).write_bytes(b"")
    before = _kernel_view(b)

    with pytest.raises(DeviceClaimed) as refused:
        engine.mount(b.id, ["nvidia.com/gpu=1"])
    assert "unreadable claim" in refused.value.message
    assert _kernel_view(b) == before

    engine.reconcile()  # rewrites it from A's record
    [repaired] = engine.ledger.claims()
    assert (repaired.owner, repaired.device) == (a.id, GPU0) and not repaired.footprint.unknown
    engine.mount(b.id, ["nvidia.com/gpu=1"])
    with pytest.raises(DeviceClaimed):
        engine.mount(b.id, [ALIAS])
    engine.unmount(a.id, [GPU0])
    engine.mount(b.id, [ALIAS])
    assert b.open_result("/dev/nvidia0") == "ENXIO"


def test_the_claim_of_a_container_that_is_gone_is_void(
    engine: Engine, make_container: Make
) -> None:
    a, b = make_container("v1"), make_container("v1")
    engine.mount(a.id, [GPU0])
    a.stop()

    engine.mount(b.id, [ALL])

    assert {c.owner for c in engine.ledger.claims()} == {b.id}
