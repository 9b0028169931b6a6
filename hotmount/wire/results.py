"""The engine's results and errors as the wire shows them: one mapping for the agent and
for `nvcli --local`, so that the same engine answer reads the same through either (the
two had drifted: `--local` left out a claim's holders and the driver's files).

Of the engine, only its error classes are imported at run time (`engine_status` tells
them apart); results and claims are read by attribute, their types named for the
checker alone.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hotmount.errors import DeviceBusy, DeviceClaimed, HotmountError, ScanIncomplete
from hotmount.wire.schemas import (
    DeviceHolder,
    DriverAdded,
    MountedDevice,
    MountResult,
    Status,
    UnmountResult,
)

if TYPE_CHECKING:
    from collections.abc import Iterable

    from hotmount.engine import results as engine
    from hotmount.state.claims import Claim


def engine_status(exc: HotmountError) -> Status:
    """An engine error as a `Status`: its reason and HTTP code, and for a busy, claimed
    or not-fully-scanned device who holds it (the client names them, `--force` stops
    them)."""
    details: dict[str, Any] | None = None
    if isinstance(exc, DeviceBusy | ScanIncomplete):
        held = exc.holders if isinstance(exc, DeviceBusy) else exc.unclassified
        details = {"holders": [{"pid": h.pid, "command": h.command, "path": h.path} for h in held]}
    elif isinstance(exc, DeviceClaimed):
        details = {"owner": exc.owner, "holders": exc.holders}
    return Status(reason=exc.reason, message=exc.message, code=exc.http_status, details=details)


def container_id_of(done: engine.MountResult | engine.UnmountResult, fallback: str = "") -> str:
    """The ID of the container the engine worked on; `fallback` when it has none (a
    process found by PID outside any container runtime's cgroup)."""
    return str(done.container.get("id") or fallback)


def mounted_devices(items: Iterable[engine.MountedDevice]) -> list[MountedDevice]:
    return [
        MountedDevice(key=m.key, kind=m.kind, index=m.index, uuid=m.uuid, paths=m.paths)
        for m in items
    ]


def mount_result(
    done: engine.MountResult,
    namespace: str | None = None,
    pod: str | None = None,
    container: str | None = None,
) -> MountResult:
    return MountResult(
        namespace=namespace,
        pod=pod,
        container=container,
        container_id=container_id_of(done),
        mounted=mounted_devices(done.mounted),
        already_mounted=mounted_devices(done.already_mounted),
        netdevs=done.netdevs,
        driver=DriverAdded.model_validate(done.driver) if done.driver else None,
    )


def unmount_result(
    done: engine.UnmountResult,
    container_id: str,
    namespace: str | None = None,
    pod: str | None = None,
    container: str | None = None,
) -> UnmountResult:
    return UnmountResult(
        namespace=namespace,
        pod=pod,
        container=container,
        container_id=container_id,
        unmounted=done.unmounted,
        not_mounted=done.not_mounted,
        stopped_pids=done.stopped_pids,
        netdevs=done.netdevs,
        driver_removed=done.driver_removed,
        driver_detached=done.driver_detached,
        unclassified_pids=done.unclassified_pids,
        unclassified_why=done.unclassified_why or None,
    )


def hot_holder(claim: Claim, pin: str | None = None) -> DeviceHolder:
    """A hot-mount's hold on a device (one engine claim), as a device's holder."""
    held_by = claim.holder.fields() if claim.holder else {}
    return DeviceHolder(
        source="hotmount",
        namespace=held_by.get("namespace"),
        pod=held_by.get("pod"),
        container=held_by.get("container"),
        container_id=claim.owner,
        device=claim.device,
        shared_with=pod_of(claim.shared_with),
        pin=pin,
    )


def pod_of(group: str | None) -> str | None:
    """`namespace/pod` -> `pod`: sharing never leaves a namespace."""
    return group.rpartition("/")[2] if group else None
