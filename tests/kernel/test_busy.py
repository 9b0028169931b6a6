"""Unmount refuses while a container process holds the device; force stops it."""

from __future__ import annotations

import pytest

from hotmount.engine.core import Engine
from hotmount.errors import DeviceBusy
from tests.kernel.conftest import GPU1
from tests.support.runc import RuncContainer


def test_busy_device_is_refused_then_forced(engine: Engine, container: RuncContainer) -> None:
    engine.mount(container.id, [GPU1])
    holder = container.hold("/dev/nvidia1")
    try:
        with pytest.raises(DeviceBusy) as refused:
            engine.unmount(container.id, [GPU1])

        assert refused.value.holders, "the holder must be named"
        assert all(h.path == "/dev/nvidia1" for h in refused.value.holders)
        for h in refused.value.holders:  # named in the message, with their command
            assert f"PID {h.pid} ({h.command}) holds /dev/nvidia1" in refused.value.message
        # Nothing changed: still mounted and usable.
        assert container.open_result("/dev/nvidia1") == "OK"
        assert GPU1 in engine.ledger.load(container.id).devices

        result = engine.unmount(container.id, [GPU1], force=True)

        assert result.unmounted == [GPU1]
        assert set(result.stopped_pids) == {h.pid for h in refused.value.holders}
        assert "nvidia1" not in container.ls_dev()
    finally:
        holder.kill()
        holder.communicate()  # reaps it and closes its pipe
    assert container.state()["status"] == "running", "force stops the holders, not the container"
