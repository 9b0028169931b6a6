"""Many mount/unmount cycles leave no BPF programs or maps behind, and no stray nodes."""

from __future__ import annotations

from hotmount.engine.core import Engine
from tests.kernel.conftest import GPU0
from tests.support.bpf import attached, object_counts
from tests.support.runc import RuncContainer

CYCLES = 200


def test_cycles_leave_nothing_behind(engine: Engine, container: RuncContainer) -> None:
    dev_before = container.ls_dev()
    engine.mount(container.id, [GPU0])
    engine.unmount(container.id, [GPU0])
    # The first v2 mount wraps the runtime's program once; nothing after may grow.
    baseline = object_counts()
    attached_before = len(attached(container.v2_dir))

    for _ in range(CYCLES):
        engine.mount(container.id, [GPU0])
        engine.unmount(container.id, [GPU0])

    assert object_counts() == baseline
    assert len(attached(container.v2_dir)) == attached_before
    assert container.ls_dev() == dev_before
    assert engine.ledger.records() == [] and engine.ledger.claims() == []
    if container.mode == "v1":
        assert "195:" not in (container.v1_devices_dir / "devices.list").read_text()
    else:
        assert engine.grants.v2(str(container.v2_dir)).state().grants == frozenset()
