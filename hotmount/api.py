"""The engine's declared public API: all that `agent` and `cli` may import from
`hotmount` (an import-linter contract in pyproject.toml says so; `hotmount.wire`, the
wire models, is the one other door).

What is here: the engine and its config; its errors; the device, record and result
types; a read-only view of mounts (`Engine.mounts`); and the few helpers the agent
shares with the engine (claim rules, RDMA companions, the look at a GPU's holders, the
bounded children's deadline). Everything else in `hotmount` may change without notice.
"""

from hotmount.config import DEFAULT_STATE_DIR, EngineConfig
from hotmount.devices.activity import ActivitySampler, GpuActivity
from hotmount.devices.companions import rdma_for
from hotmount.devices.inventory import DEFAULT_CDI_DIRS, Inventory
from hotmount.devices.model import Device, DeviceKind, DeviceNode, MigDetails
from hotmount.devices.rdma import RDMA_NODE_DIR, is_rdma
from hotmount.engine.core import Engine
from hotmount.engine.results import (
    ContainerStatus,
    MountedDevice,
    MountResult,
    ReconcileReport,
    UnmountResult,
)
from hotmount.engine.suspension import DEFAULT_LOCK_TIMEOUT
from hotmount.engine.view import Mounts
from hotmount.errors import (
    ChildTimeout,
    Conflict,
    ContainerNotFound,
    DeviceBusy,
    DeviceClaimed,
    DeviceNotFound,
    DriverRefused,
    DriverUnavailable,
    HeldWithStayingDevices,
    HotmountError,
    InvalidContainerRef,
    InvalidDeviceRef,
    InvalidRequest,
    KernelError,
    NotFound,
    NotInContainer,
    ScanIncomplete,
    UnsafePath,
)
from hotmount.host.usage import look as scan_holders
from hotmount.host.usage import nvml_pids
from hotmount.netdev.plan import DEFAULT_INSIDE_NAME, NetdevSpec
from hotmount.state.claims import Claim, Footprint, Workload, claimed_error
from hotmount.state.claims import blocking as blocking_claims
from hotmount.state.ledger import (
    ContainerRecord,
    DeviceRecord,
    SuspendedGpu,
    atomic_write,
    now,
)
from hotmount.suspend.choose import Candidate, NoGpuFree
from hotmount.suspend.model import Listed, ResumeResult, SuspendResult, gpu_uuid
from hotmount.suspend.processes import Progress
from hotmount.tenantfs.forked import last_finished, set_default_deadline

__all__ = [
    "DEFAULT_CDI_DIRS",
    "DEFAULT_INSIDE_NAME",
    "DEFAULT_LOCK_TIMEOUT",
    "DEFAULT_STATE_DIR",
    "RDMA_NODE_DIR",
    "ActivitySampler",
    "Candidate",
    "ChildTimeout",
    "Claim",
    "Conflict",
    "ContainerNotFound",
    "ContainerRecord",
    "ContainerStatus",
    "Device",
    "DeviceBusy",
    "DeviceClaimed",
    "DeviceKind",
    "DeviceNode",
    "DeviceNotFound",
    "DeviceRecord",
    "DriverRefused",
    "DriverUnavailable",
    "Engine",
    "EngineConfig",
    "Footprint",
    "GpuActivity",
    "HeldWithStayingDevices",
    "HotmountError",
    "InvalidContainerRef",
    "InvalidDeviceRef",
    "InvalidRequest",
    "Inventory",
    "KernelError",
    "Listed",
    "MigDetails",
    "MountResult",
    "MountedDevice",
    "Mounts",
    "NetdevSpec",
    "NoGpuFree",
    "NotFound",
    "NotInContainer",
    "Progress",
    "ReconcileReport",
    "ResumeResult",
    "ScanIncomplete",
    "SuspendResult",
    "SuspendedGpu",
    "UnmountResult",
    "UnsafePath",
    "Workload",
    "atomic_write",
    "blocking_claims",
    "claimed_error",
    "gpu_uuid",
    "is_rdma",
    "last_finished",
    "now",
    "nvml_pids",
    "rdma_for",
    "scan_holders",
    "set_default_deadline",
]
