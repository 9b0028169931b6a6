"""Bad input gets a clear error and changes nothing: no grant, no node, no record."""

from __future__ import annotations

import os
from collections.abc import Callable

import pytest

from hotmount.engine.core import Engine
from hotmount.errors import (
    ContainerNotFound,
    DeviceNotFound,
    HotmountError,
    InvalidContainerRef,
    InvalidDeviceRef,
    NotInContainer,
)
from tests.kernel.conftest import GPU0
from tests.support.bpf import attached
from tests.support.runc import RuncContainer, new_id


def _kernel_view(container: RuncContainer) -> tuple[object, ...]:
    v1 = container.v1_devices_dir / "devices.list"
    return (
        v1.read_text() if v1.exists() else None,
        [(p.id, p.name) for p in attached(container.v2_dir)],
        container.ls_dev(),
    )


CASES: list[tuple[str, Callable[[RuncContainer], tuple[str, list[str]]], type[HotmountError]]] = [
    ("unknown-device", lambda c: (c.id, ["nvidia.com/gpu=7"]), DeviceNotFound),
    ("unknown-index", lambda c: (c.id, ["3"]), DeviceNotFound),
    ("raw-major-minor", lambda c: (c.id, ["195:0"]), InvalidDeviceRef),
    ("raw-v1-rule", lambda c: (c.id, ["c 8:0 rwm"]), InvalidDeviceRef),
    ("device-path", lambda c: (c.id, ["/dev/sda"]), InvalidDeviceRef),
    ("block-device", lambda c: (c.id, ["nvidia.com/gpu=disk"]), InvalidDeviceRef),
    ("no-such-container", lambda c: (new_id(), [GPU0]), ContainerNotFound),
    ("malformed-id", lambda c: (c.id[:-1], [GPU0]), InvalidContainerRef),
    ("malformed-prefix", lambda c: ("containerd://../../etc", [GPU0]), InvalidContainerRef),
    ("host-pid-1", lambda c: ("pid:1", [GPU0]), NotInContainer),
    ("host-process", lambda c: (f"pid:{os.getpid()}", [GPU0]), NotInContainer),
]


@pytest.mark.parametrize(("case", "request_of", "error"), CASES, ids=[c[0] for c in CASES])
def test_refused_and_nothing_changes(
    engine: Engine,
    container: RuncContainer,
    case: str,
    request_of: Callable[[RuncContainer], tuple[str, list[str]]],
    error: type[HotmountError],
) -> None:
    before = _kernel_view(container)
    ref, devices = request_of(container)

    with pytest.raises(error) as raised:
        engine.mount(ref, devices)

    assert raised.value.message and "\n" not in raised.value.message
    assert _kernel_view(container) == before
    assert engine.ledger.records() == [] and engine.ledger.claims() == []


def test_container_that_exits_mid_operation(engine: Engine, container: RuncContainer) -> None:
    resolved = engine.resolve(container.id)
    container.stop()

    with pytest.raises(ContainerNotFound):
        engine.mount(resolved, [GPU0])

    assert engine.ledger.records() == [] and engine.ledger.claims() == []


def test_pid_of_a_container_process_is_accepted(engine: Engine, container: RuncContainer) -> None:
    result = engine.mount(f"pid:{container.pid}", [GPU0])

    assert result.container["id"] == container.id
    assert container.open_result("/dev/nvidia0") == "ENXIO"
