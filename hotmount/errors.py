"""The engine's exception tree; every error carries a machine-readable reason.

    HotmountError
    ├── InvalidRequest            400  bad input: refused before any side effect
    │   ├── InvalidContainerRef        malformed container ID or PID
    │   ├── InvalidDeviceRef           raw major:minor, block device, malformed name
    │   ├── NotInContainer             host PID 1, or a process in the host's namespaces
    │   └── DriverUnavailable          driver files asked for, but no CDI mounts nor driver root
    ├── NotFound                  404
    │   ├── ContainerNotFound          no such container, or it exited mid-operation
    │   └── DeviceNotFound             not in the node's inventory
    ├── Conflict                  409
    │   ├── DeviceBusy                 a container process holds the device open
    │   │   └── HeldWithStayingDevices     ...and also a device that stays: never stopped
    │   ├── DeviceClaimed              the same physical device is hot-mounted elsewhere
    │   ├── UnsafePath                 an existing path is not the expected device node
    │   └── DriverRefused              the driver's files cannot be placed (a read-only root)
    └── KernelError               500  a syscall failed for a reason that is not the caller's
        ├── BpfError                   a bpf() command failed (verifier log attached)
        └── ChildTimeout          504  a bounded child ran past its deadline and was killed
            └── ScanIncomplete         the look at open files could not tell who holds a device

The agent maps `reason` and the HTTP code straight into a Kubernetes `Status`.
"""

from __future__ import annotations

from dataclasses import dataclass


class HotmountError(Exception):
    """Base of every error the engine raises on purpose."""

    reason = "InternalError"
    http_status = 500

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class InvalidRequest(HotmountError):
    reason = "BadRequest"
    http_status = 400


class InvalidContainerRef(InvalidRequest):
    reason = "InvalidContainer"


class InvalidDeviceRef(InvalidRequest):
    reason = "InvalidDevice"


class NotInContainer(InvalidRequest):
    reason = "NotInContainer"


class DriverUnavailable(InvalidRequest):
    reason = "DriverUnavailable"


class NotFound(HotmountError):
    reason = "NotFound"
    http_status = 404


class ContainerNotFound(NotFound):
    reason = "ContainerNotFound"


class DeviceNotFound(NotFound):
    reason = "DeviceNotFound"


class Conflict(HotmountError):
    reason = "Conflict"
    http_status = 409


@dataclass(frozen=True)
class Holder:
    """A process that holds one of a device's nodes open."""

    pid: int
    command: str
    path: str


class DeviceBusy(Conflict):
    reason = "DeviceBusy"

    def __init__(self, message: str, holders: list[Holder]) -> None:
        super().__init__(message)
        self.holders = holders


class HeldWithStayingDevices(DeviceBusy):
    """A holder of a leaving device also holds (or has an NVML context on) a device that
    stays in the container: `force` does not stop it, as that would take the staying
    devices from it too (a trainer on GPU 1 when GPU 0 leaves). Same reason, same 409."""


class DeviceClaimed(Conflict):
    reason = "DeviceClaimed"

    def __init__(
        self, message: str, owner: str, holders: list[dict[str, str]] | None = None
    ) -> None:
        super().__init__(message)
        self.owner = owner
        self.holders = holders or []


class UnsafePath(Conflict):
    reason = "UnsafePath"


class DriverRefused(Conflict):
    reason = "DriverRefused"


class KernelError(HotmountError):
    reason = "KernelError"
    http_status = 500


class BpfError(KernelError):
    reason = "BpfError"


class ChildTimeout(KernelError):
    """A forked child (container filesystem work, a mount namespace step) ran past its
    deadline and was killed: a tenant's filesystem that never answers costs one call."""

    reason = "Timeout"
    http_status = 504


class ScanIncomplete(ChildTimeout):
    """The look at a container's open files could not finish in time (a flood of fds, a
    filesystem that does not answer): whether `unclassified` hold the device is unknown.
    An unmount without `force` is refused with it, and nothing changes; `force` goes on
    without that answer (hotmount/host/usage.py)."""

    def __init__(self, message: str, unclassified: list[Holder]) -> None:
        super().__init__(message)
        self.unclassified = unclassified
