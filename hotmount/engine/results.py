"""What the engine answers: plain dataclasses, turned to JSON by `as_dict` (the CLI's
`--json`, the agent's conversions to its API schemas)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass
class MountedDevice:
    key: str
    kind: str
    index: int | None
    uuid: str | None
    paths: list[str]


@dataclass
class MountResult:
    container: dict[str, object]
    mounted: list[MountedDevice]
    already_mounted: list[MountedDevice]
    netdevs: list[str] = field(default_factory=list)  # host interfaces moved in
    # The driver's files added (hotmount/driver/): origin, files, env to export, notes.
    driver: dict[str, object] | None = None

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


@dataclass
class UnmountResult:
    container: dict[str, object]
    unmounted: list[str]
    not_mounted: list[str]
    stopped_pids: list[int]
    removed_nodes: list[str]
    netdevs: list[str] = field(default_factory=list)  # host interfaces given back
    driver_removed: list[str] = field(default_factory=list)  # driver files taken out
    driver_detached: list[str] = field(default_factory=list)  # of those, busy: detached lazily
    # A forced unmount whose look at open files could not finish: the PIDs (in
    # stopped_pids too) it stopped after the revoke because no look cleared them, and why.
    unclassified_pids: list[int] = field(default_factory=list)
    unclassified_why: str = ""

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


@dataclass
class NodeStatus:
    path: str
    major: int
    minor: int
    state: str
    granted: bool
    created_by_us: bool


@dataclass
class DeviceStatus:
    key: str
    kind: str
    mounted_at: str
    metadata: dict[str, str]
    nodes: list[NodeStatus]


@dataclass
class ContainerStatus:
    key: str
    container_id: str | None
    init_pid: int
    running: bool
    devices: list[DeviceStatus]
    pending: str | None

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


@dataclass
class ReconcileReport:
    checked: int = 0
    regranted: int = 0
    rewrapped: int = 0
    recreated: int = 0
    pending_finished: int = 0
    forgotten: list[str] = field(default_factory=list)
    errors: dict[str, str] = field(default_factory=dict)
    netdevs: list[str] = field(default_factory=list)  # interfaces restored or forgotten

    @property
    def repairs(self) -> int:
        return self.regranted + self.rewrapped + self.recreated + self.pending_finished

    def as_dict(self) -> dict[str, object]:
        return asdict(self)
