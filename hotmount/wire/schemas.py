"""The wire format the agent serves and nvcli reads: request and response models, and
the `Status` error body. Both sides import it; it imports neither (pyproject.toml's
import-linter contracts), and of the engine only a network interface's spec at run time.

Paths (JSON, camelCase, OpenAPI at /openapi.json):

    GET    /healthz, /readyz, /metrics
    GET    /v1/devices                                        -> DeviceList
    GET    /v1/namespaces/{ns}/pods/{pod}/devices             -> PodDevices
    POST   /v1/namespaces/{ns}/pods/{pod}/devices             MountRequest -> MountResult
    DELETE /v1/namespaces/{ns}/pods/{pod}/devices/{device}?force=&container=  -> UnmountResult
    POST   /v1/namespaces/{ns}/pods/{pod}/suspend             SuspendRequest -> SuspendResult
    POST   /v1/namespaces/{ns}/pods/{pod}/resume              ResumeRequest -> ResumeResult
    GET    /v1/namespaces/{ns}/pods/{pod}/suspend|resume?container=  -> OperationProgress
    POST   /v1/namespaces/{ns}/pods/{pod}/acquire|release     (hotmount/wire/ondemand.py)
    POST   /v1/reassign                                       ReassignRequest -> ReassignResult
    standalone (--no-kubernetes):
    GET    /v1/containers/{id}/devices                        -> PodDevices
    POST   /v1/containers/{id}/devices                        MountRequest -> MountResult
    DELETE /v1/containers/{id}/devices/{device}?force=        -> UnmountResult

The aggregated API (`hotmount.io/v1alpha1`, served behind an APIService) carries the
same models inside Kubernetes-style objects (`agent/aggregated/`). Every error is a
`Status` with a `reason` a program can branch on.
"""

from __future__ import annotations

import ipaddress
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    model_validator,
)
from pydantic.alias_generators import to_camel

from hotmount.netdev.plan import DEFAULT_INSIDE_NAME, NetdevSpec
from hotmount.wire.durations import format_duration, parse_duration

if TYPE_CHECKING:  # only the engine's side (the agent, `nvcli --local`) builds from these
    from hotmount.devices.model import Device, MigDetails

DeviceRef = Annotated[
    str,
    StringConstraints(min_length=1, max_length=160, pattern=r"^[A-Za-z0-9][A-Za-z0-9_./:=-]*$"),
]
KubeName = Annotated[
    str,
    StringConstraints(min_length=1, max_length=253, pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"),
]
IfName = Annotated[
    str, StringConstraints(min_length=1, max_length=15, pattern=r"^[A-Za-z0-9_.-]+$")
]
IfAddress = Annotated[
    str,
    StringConstraints(max_length=64, pattern=r"^[0-9A-Fa-f:.]+/\d{1,3}$"),
    AfterValidator(lambda v: str(ipaddress.ip_interface(v))),
]
ContainerName = Annotated[
    str, StringConstraints(min_length=1, max_length=63, pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
]
# `30m`, `90s`, `1h30m` (hotmount/wire/durations.py), read back in its short form
# (`90m` -> `1h30m`).
Duration = Annotated[
    str,
    StringConstraints(max_length=32),
    AfterValidator(lambda v: format_duration(parse_duration(v))),
]


class Model(BaseModel):
    """Replies: unknown fields are ignored, so an older client reads a newer agent."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")


class Request(Model):
    """Requests: unknown fields are refused, so a typo is an error, not a silent default."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")


class Status(Model):
    """Kubernetes' `Status`: what every error looks like on the wire."""

    kind: Literal["Status"] = "Status"
    api_version: Literal["v1"] = "v1"
    status: Literal["Failure", "Success"] = "Failure"
    reason: str
    message: str
    code: int
    details: dict[str, Any] | None = None


class DeviceHolder(Model):
    """Who has a device: the kubelet (PodResources) or a hot-mount (the agent's ledger).

    `device` is the name it holds it under: the same physical device may be held as
    `=all`, a MIG instance or a kubelet ID (`GPU-<uuid>::1`); `sharedWith` is the pod
    it joined on purpose.
    """

    source: Literal["kubelet", "hotmount"]
    namespace: str | None = None
    pod: str | None = None
    container: str | None = None
    container_id: str | None = None
    device: str | None = None
    shared_with: str | None = None
    # A hot-mount: the pin pod that keeps it in the scheduler's books (its namespace's).
    pin: str | None = None


class MigInfo(Model):
    """A MIG instance's IDs; `source` nvml (with `profile`, `memoryMiB` and the device's
    `uuid`) or procfs (NVML did not load or list it: no UUID)."""

    gpu_instance: int
    compute_instance: int
    source: str
    profile: str | None = None
    memory_mib: int | None = Field(default=None, alias="memoryMiB")

    @classmethod
    def of(cls, mig: MigDetails | None) -> MigInfo | None:
        if mig is None:
            return None
        return cls(
            gpu_instance=mig.gpu_instance,
            compute_instance=mig.compute_instance,
            source=mig.source,
            profile=mig.profile,
            memory_mib=mig.memory_mib,
        )


class DeviceInfo(Model):
    key: str
    kind: str
    index: int | None = None
    uuid: str | None = None
    pci_bus_id: str | None = None
    minor: int | None = None
    parent: str | None = None
    aliases: list[str] = Field(default_factory=list)
    nodes: list[str]
    holder: DeviceHolder | None = None  # the first of `holders` (older clients read this)
    holders: list[DeviceHolder] = Field(default_factory=list)
    numa_node: int | None = None
    netdevs: list[str] = Field(default_factory=list)  # an RDMA NIC's network interfaces
    # RDMA: the GPUs whose nearest NIC this is; a GPU: its nearest RDMA device (withRdma).
    nearest_gpus: list[str] = Field(default_factory=list)
    nearest_rdma: str | None = None
    # Whose books the GPU is in: device-plugin, dra or unmanaged (None: not a GPU, or
    # not known here, as with `nvcli --local`). docs/api.md, "Accounting".
    management: str | None = None
    mig: MigInfo | None = None  # a MIG instance's IDs, profile and memory
    # Seconds its hot-mount has been idle, as the reconciler last saw (the least of them
    # when several containers share it); None: not hot-mounted, or not looked at yet.
    idle_seconds: int | None = None

    @classmethod
    def of(
        cls,
        device: Device,
        holders: list[DeviceHolder],
        nearest_gpus: list[str] | None = None,
        nearest_rdma: str | None = None,
        management: str | None = None,
    ) -> DeviceInfo:
        """An inventory device as the wire shows it (the agent and `nvcli --local` alike):
        one entry per physical device, with every name it has and everyone who holds it."""
        return cls(
            key=device.key,
            kind=str(device.kind),
            index=device.index,
            uuid=device.uuid,
            pci_bus_id=device.pci_bus_id,
            minor=device.minor,
            parent=device.parent,
            aliases=list(device.aliases),
            nodes=[n.path for n in device.nodes],
            holder=holders[0] if holders else None,
            holders=holders,
            numa_node=device.numa_node,
            netdevs=list(device.netdevs),
            nearest_gpus=nearest_gpus or [],
            nearest_rdma=nearest_rdma,
            management=management,
            mig=MigInfo.of(device.mig),
        )


class QueuedRequest(Model):  # a place in the node's on-demand queue (wire/ondemand.py)
    namespace: str
    pod: str
    model: str | None  # None: any model
    position: int  # 1: the next served among the waiters for its model
    waited_seconds: float
    priority: int = 0


class DeviceList(Model):
    node: str | None
    devices: list[DeviceInfo]
    queue: list[QueuedRequest] = Field(default_factory=list)  # on-demand pods waiting


class NetdevRequest(Request):
    """A network interface to move into the container with the devices: `name` on the
    host (absent: the RDMA NIC's own), renamed `inside`, with `mtu` and `addresses`."""

    name: IfName | None = None
    inside: IfName = DEFAULT_INSIDE_NAME
    mtu: int | None = Field(default=None, ge=68, le=65535)
    addresses: list[IfAddress] = Field(default_factory=list, max_length=16)

    def spec(self) -> NetdevSpec:
        return NetdevSpec(
            name=self.name, inside=self.inside, mtu=self.mtu, addresses=list(self.addresses)
        )


class MountRequest(Request):
    """`container` (one name) or `containers` (several, or `["*"]` for all of the pod's):
    the same devices go into each, shared within the pod without force. `shareWith`
    names a pod of the same namespace whose hold on these devices this mount joins.
    `idleTimeout`: take the devices back once no process has held them for this long
    (else the pod's `hotmount.io/idle-timeout` annotation, else the node's default)."""

    container: ContainerName | None = None
    containers: list[ContainerName | Literal["*"]] | None = Field(
        default=None, min_length=1, max_length=16
    )
    devices: list[DeviceRef] | None = Field(default=None, min_length=1, max_length=64)
    count: int | None = Field(default=None, ge=1, le=64)
    share_with: KubeName | None = None
    force: bool = False
    # RDMA devices that come and go with the named GPUs: each one's nearest NIC, or these.
    # (None, not False, by default: a client leaves them out, so an older agent reads it.)
    with_rdma: bool | None = None
    rdma: list[DeviceRef] | None = Field(default=None, min_length=1, max_length=16)
    # A network interface moved into the container's network namespace with them.
    with_netdev: bool | None = None
    netdev: NetdevRequest | None = None
    idle_timeout: Duration | None = None
    # `unheld`, `unused` or `suspend` (agent/idle/policy.py); else hotmount.io/idle-policy, else
    # --idle-policy.
    idle_policy: Literal["unheld", "unused", "suspend"] | None = None
    # How long before the reclaim the GPUIdleSoon warning comes (below idleTimeout); else
    # hotmount.io/idle-warn-before, else a tenth of the timeout, at least 1m.
    warn_before: Duration | None = None
    # This mount only: not mounted again into a container that replaces this one after a
    # restart (agent/node/remounts.py). None by default, for older agents.
    once: bool | None = None
    # The driver's user-space files too (docs/driver.md): true brings them (400 when the node
    # has no source), false never; None (left out) takes the node's --inject-driver.
    with_driver: bool | None = None

    @model_validator(mode="after")
    def _devices_or_count(self) -> MountRequest:
        if (self.devices is None) == (self.count is None):
            raise ValueError("give either devices or count, not both and not neither")
        if self.container is not None and self.containers is not None:
            raise ValueError("give container or containers, not both")
        if self.containers and "*" in self.containers and len(self.containers) > 1:
            raise ValueError('containers: "*" means all of them and stands alone')
        return self

    @model_validator(mode="after")
    def _rdma_with_devices(self) -> MountRequest:
        if (self.with_rdma or self.rdma) and self.devices is None:
            raise ValueError("withRdma and rdma come with named devices, not with count")
        wanted = self.netdev_request()
        if wanted is not None:
            if self.devices is None:
                raise ValueError("withNetdev and netdev come with named devices, not with count")
            if self.containers is not None and (
                len(self.containers) != 1 or self.containers == ["*"]
            ):
                raise ValueError("an interface moves into one container: name one")
            if wanted.name is None and not (self.with_rdma or self.rdma):
                raise ValueError(
                    "withNetdev without netdev.name takes the RDMA NIC's own interface: "
                    "add withRdma or rdma, or name the interface"
                )
        return self

    def netdev_request(self) -> NetdevRequest | None:
        return self.netdev or (NetdevRequest() if self.with_netdev else None)

    def rdma_options(self) -> dict[str, Any]:
        """The engine's keywords for what rides along: RDMA devices (hotmount/devices/companions.py)
        and a network interface (hotmount/netdev/moves.py)."""
        wanted = self.netdev_request()
        netdev = wanted.spec() if wanted is not None else None
        return {"with_rdma": bool(self.with_rdma), "rdma": self.rdma, "netdev": netdev}

    def container_names(self) -> list[str | None]:
        """The containers asked for; [None] is the pod's default, ["*"] all of them."""
        if self.containers is not None:
            return list(dict.fromkeys(self.containers))
        return [self.container]


class MountedDevice(Model):
    key: str
    kind: str
    index: int | None = None
    uuid: str | None = None
    paths: list[str]
    shared_with: str | None = None  # the pod whose device this mount joined on purpose
    # Everyone else who holds the same physical device (a shared GPU shows both holders).
    other_holders: list[DeviceHolder] = Field(default_factory=list)
    idle_timeout: str | None = None  # reclaimed after this long unheld (None: never)
    # Seconds no process has held it, as the reconciler last saw (0: held; None: not yet seen).
    idle_seconds: int | None = None
    idle_policy: str | None = None  # unheld, unused or suspend; None from an older agent
    # Seconds until the reclaim once warned (GPUIdleSoon); None: not warned.
    reclaim_in_seconds: int | None = None
    # Why `unused` fell back to `unheld` for this GPU (NVML cannot sample it).
    idle_policy_note: str | None = None
    pin: str | None = None  # the pin pod that keeps it in the scheduler's books
    holder: str | None = None  # the holder pod of a mount by count (its books)
    mounted_at: str | None = None  # ISO 8601, UTC: when it was hot-mounted
    # suspended: taken away by a suspension (no paths), its processes kept for a resume
    state: Literal["mounted", "suspended"] = "mounted"


class DriverAdded(Model):
    """The driver's files a mount added (docs/driver.md). `env`: what the caller exports
    (running processes cannot take it); `notes`: why, when it is not empty."""

    origin: str
    files: list[str]
    env: dict[str, str] = Field(default_factory=dict)
    ignored_hooks: list[str] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)


class ContainerMount(Model):
    container: str | None = None
    container_id: str
    mounted: list[MountedDevice]
    already_mounted: list[MountedDevice]
    driver: DriverAdded | None = None


class MountResult(Model):
    """The first (or only) container's result at the top, as before; `containers` has
    every container's when several were asked for."""

    namespace: str | None = None
    pod: str | None = None
    container: str | None = None
    container_id: str
    mounted: list[MountedDevice]
    already_mounted: list[MountedDevice]
    holder_pod: str | None = None
    containers: list[ContainerMount] = Field(default_factory=list)
    netdevs: list[str] = Field(default_factory=list)  # host interfaces moved into the pod
    driver: DriverAdded | None = None  # the driver's files this mount added (none: None)


class UnmountResult(Model):
    namespace: str | None = None
    pod: str | None = None
    container: str | None = None
    container_id: str
    unmounted: list[str]
    not_mounted: list[str]
    stopped_pids: list[int]
    holder_pods_deleted: list[str] = Field(default_factory=list)
    netdevs: list[str] = Field(default_factory=list)  # host interfaces given back
    driver_removed: list[str] = Field(default_factory=list)  # the driver's files taken out
    driver_detached: list[str] = Field(default_factory=list)  # of those, busy: detached lazily
    # A forced unmount whose look at the open files could not finish (a flood of fds, a
    # filesystem that does not answer): the PIDs (among stopped_pids) it stopped without
    # telling whether they held the device, after the revoke, and why.
    unclassified_pids: list[int] = Field(default_factory=list)
    unclassified_why: str | None = None


# The most a caller may let each CUDA process take to lock (drain its GPU work) on
# suspend, all of it under the container's lock (reconcile's repairs of it wait): well
# below the heartbeat's 60 s allowance, which counts the lock call (this plus a 30 s
# margin) as progress only when it returns.
MAX_LOCK_TIMEOUT = 30.0


class SuspendRequest(Request):
    """POST .../suspend: the container whose GPUs go (default: the pod's only one);
    `lockTimeoutSeconds`: how long each CUDA process may take to lock (at most
    MAX_LOCK_TIMEOUT seconds: a longer one is a 422)."""

    container: ContainerName | None = None
    lock_timeout_seconds: float = Field(default=10.0, gt=0, le=MAX_LOCK_TIMEOUT)


class ResumeRequest(Request):
    """POST .../resume: `mount`, GPUs (UUIDs, indexes, keys) to resume onto, one per
    suspended GPU; default the same GPU if free, else one of the same model."""

    container: ContainerName | None = None
    mount: list[DeviceRef] | None = Field(default=None, max_length=16)


class CheckpointedProcess(Model):
    """A process a suspend checkpointed (or a resume restored). `pid`: its PID in the
    container's own PID namespace, as `ps` in the container shows it, never the host's;
    null for a process of another PID namespace (one nested in the container's), or one
    suspended by an agent that did not record it."""

    pid: int | None
    gpu_bytes: int


class SuspendResult(Model):
    namespace: str | None = None
    pod: str | None = None
    container: str | None = None
    container_id: str
    suspended: list[str]
    processes: list[CheckpointedProcess]
    host_bytes: int  # GPU memory moved into the processes' host memory
    holder_pods_deleted: list[str] = Field(default_factory=list)


class ResumeResult(Model):
    namespace: str | None = None
    pod: str | None = None
    container: str | None = None
    container_id: str
    resumed: dict[str, str]  # suspended GPU -> the GPU it resumed onto
    processes: list[CheckpointedProcess]


class OperationProgress(Model):
    """GET .../suspend or .../resume: the operation of that kind running on the pod, for a
    caller to poll while its POST runs (agent/suspend/progress.py says why a GET).
    `running: false` when none runs (not yet, or done). Counts grow as it goes: processes
    locked and checkpointed (suspend) or restored (resume), and `movedBytes`, the GPU
    memory (NVML's per-process used memory) of the processes checkpointed or restored so
    far, out of `gpuBytes`."""

    namespace: str | None = None
    pod: str | None = None
    op: Literal["suspend", "resume"]
    running: bool
    container: str | None = None
    # starting, locking, checkpointing, unmounting, unmounted; mounting, mounted, restoring
    step: str | None = None
    processes: int | None = None  # the CUDA processes found (None: not counted yet)
    gpu_bytes: int | None = None  # their GPU memory, all together
    locked: int = 0
    checkpointed: int = 0
    restored: int = 0
    moved_bytes: int = 0
    elapsed_seconds: float | None = None


class ContainerDevices(Model):
    container: str | None
    container_id: str
    devices: list[MountedDevice]


class PodDevices(Model):
    namespace: str | None = None
    pod: str | None = None
    node: str | None = None  # the node whose agent answered
    pod_uid: str | None = None
    containers: list[ContainerDevices]
    queued: int | None = None  # on demand: its place in the node's queue for a GPU


class PodRef(Request):
    namespace: KubeName
    pod: KubeName
    container: ContainerName | None = None


class ReassignRequest(Request):
    device: DeviceRef
    from_: PodRef = Field(alias="from")
    to: PodRef
    force: bool = False


class ReassignResult(Model):
    device: str
    from_: PodRef = Field(alias="from")
    to: PodRef
    unmounted: UnmountResult
    mounted: MountResult
