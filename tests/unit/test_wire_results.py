"""The engine's answers as the wire shows them (hotmount/wire/results.py): the one
mapping the agent and `nvcli --local` share, so its every branch is held here."""

from __future__ import annotations

import pytest

from hotmount import errors
from hotmount.engine import results as engine
from hotmount.state.claims import Claim, Workload
from hotmount.wire.errors import EXIT_CONFLICT, EXIT_NOT_FOUND, EXIT_TIMEOUT, EXIT_USAGE, error_for
from hotmount.wire.results import (
    container_id_of,
    engine_status,
    hot_holder,
    mount_result,
    unmount_result,
)


def _every_engine_error() -> list[type[errors.HotmountError]]:
    found, todo = [], [errors.HotmountError]
    while todo:
        cls = todo.pop()
        found.append(cls)
        todo += cls.__subclasses__()
    return found


def _instance(cls: type[errors.HotmountError]) -> errors.HotmountError:
    if issubclass(cls, errors.DeviceBusy):
        return cls("busy", [errors.Holder(7, "python", "/dev/nvidia0")])  # type: ignore[call-arg]
    if issubclass(cls, errors.ScanIncomplete):
        return cls("no answer", [errors.Holder(8, "cat", "?")])  # type: ignore[call-arg]
    if issubclass(cls, errors.DeviceClaimed):
        return cls("claimed", "c1", [{"containerId": "c1", "device": "gpu0"}])  # type: ignore[call-arg]
    return cls("why")


@pytest.mark.parametrize("cls", _every_engine_error(), ids=lambda c: c.__name__)
def test_every_engine_error_keeps_its_reason_code_and_message(
    cls: type[errors.HotmountError],
) -> None:
    status = engine_status(_instance(cls))
    assert (status.reason, status.code) == (cls.reason, cls.http_status)
    assert status.message and status.status == "Failure"


def test_who_holds_a_device_travels_with_the_refusal() -> None:
    busy = engine_status(_instance(errors.DeviceBusy))
    assert busy.details == {"holders": [{"pid": 7, "command": "python", "path": "/dev/nvidia0"}]}
    unscanned = engine_status(_instance(errors.ScanIncomplete))
    assert unscanned.details == {"holders": [{"pid": 8, "command": "cat", "path": "?"}]}
    claimed = engine_status(_instance(errors.DeviceClaimed))
    assert claimed.details == {"owner": "c1", "holders": [{"containerId": "c1", "device": "gpu0"}]}
    assert engine_status(errors.DeviceNotFound("no gpu9")).details is None


@pytest.mark.parametrize(
    ("error", "exit_code"),
    [
        (errors.DeviceBusy("busy", []), EXIT_CONFLICT),
        (errors.DeviceClaimed("claimed", "c1"), EXIT_CONFLICT),
        (errors.ContainerNotFound("gone"), EXIT_NOT_FOUND),
        (errors.InvalidDeviceRef("disk"), EXIT_USAGE),
        (errors.ChildTimeout("slow"), EXIT_TIMEOUT),
    ],
    ids=lambda v: type(v).__name__ if isinstance(v, Exception) else str(v),
)
def test_an_engine_error_exits_as_the_agents_refusal_would(
    error: errors.HotmountError, exit_code: int
) -> None:
    assert error_for(engine_status(error)).exit_code == exit_code


def test_a_mount_result_carries_netdevs_and_the_driver() -> None:
    done = engine.MountResult(
        container={"id": "c1", "initPid": 42},
        mounted=[engine.MountedDevice("gpu0", "gpu", 0, "GPU-1", ["/dev/nvidia0"])],
        already_mounted=[],
        netdevs=["eth1"],
        driver={"origin": "cdi", "files": ["/usr/lib/libcuda.so.1"]},
    )
    result = mount_result(done, namespace="ml", pod="nb-0", container="main")
    assert (result.namespace, result.pod, result.container) == ("ml", "nb-0", "main")
    assert result.container_id == "c1"
    assert [(d.key, d.index, d.paths) for d in result.mounted] == [("gpu0", 0, ["/dev/nvidia0"])]
    assert result.netdevs == ["eth1"]
    assert result.driver is not None and result.driver.files == ["/usr/lib/libcuda.so.1"]
    assert mount_result(engine.MountResult({"id": None}, [], [])).container_id == ""


def test_an_unmount_result_names_the_container_it_is_given() -> None:
    done = engine.UnmountResult(
        container={"id": None, "initPid": 42},
        unmounted=["gpu0"],
        not_mounted=[],
        stopped_pids=[7],
        removed_nodes=["/dev/nvidia0"],
        driver_removed=["/usr/lib/libcuda.so.1"],
    )
    result = unmount_result(done, container_id_of(done, "pid:42"))
    assert result.container_id == "pid:42"
    assert (result.unmounted, result.stopped_pids) == (["gpu0"], [7])
    assert result.driver_removed == ["/usr/lib/libcuda.so.1"]
    assert result.unclassified_why is None  # the engine's "" is no reason


def test_a_claim_is_a_hotmount_holder_named_after_its_pod() -> None:
    claim = Claim(
        owner="c1",
        device="gpu0",
        group="ml/nb-0",
        footprint=None,  # type: ignore[arg-type]
        shared_with="ml/nb-1",
        holder=Workload("ml", "nb-0", "main"),
    )
    holder = hot_holder(claim, pin="nb-0-pin")
    assert (holder.source, holder.namespace, holder.pod, holder.container) == (
        "hotmount",
        "ml",
        "nb-0",
        "main",
    )
    assert (holder.container_id, holder.device, holder.shared_with, holder.pin) == (
        "c1",
        "gpu0",
        "nb-1",
        "nb-0-pin",
    )
