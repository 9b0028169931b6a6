"""The steps that hand an on-demand pod's GPU over (agent/ondemand/arbiter.py decides
when): attach (resume onto a free GPU of its model, or mount its first by name, pinned as
a mount by name is) and suspend, through the node's use cases, which take the container's
lock and keep the books; and what the arbiter reads of a pod's GPUs in the ledger."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from agent.errors import AllocatedToPod, ApiError, Unschedulable
from agent.kube.client import PodInfo
from agent.metrics import OnDemandMetrics
from agent.ondemand import policy
from agent.suspend.suspending import Suspending
from hotmount.api import Candidate, DeviceClaimed, Engine, HotmountError, gpu_uuid
from hotmount.wire.schemas import MountRequest, MountResult

TAKEN = (AllocatedToPod, Unschedulable, DeviceClaimed)  # a free GPU taken meanwhile
LOCK_TIMEOUT = 10.0  # seconds each CUDA process may take to lock on an on-demand suspend


@dataclass
class Tracked:
    """An on-demand pod the agent has seen ask."""

    info: PodInfo
    container: str
    container_id: str
    caller: str
    wants: policy.OnDemand
    model: str  # "": any model (no GPU held yet and none named)
    busy: bool = False  # a cell runs: never suspended
    idle_since: float | None = None
    attached_at: float | None = None
    ticket: int | None = None
    asked_at: float | None = None  # when the waiting cell first asked
    last_asked: float = 0.0
    moving: bool = False  # a resume or suspend of it runs
    leaves: int = 0  # places given up: a call that waited across one ends
    refused_until: float = 0.0  # its suspend was refused: not tried again until then
    failure: ApiError | HotmountError | None = None  # a waiter's refusal, told at its next ask
    resumed: dict[str, str] = field(default_factory=dict)  # what the hand-over did for it

    @property
    def key(self) -> tuple[str, str]:
        return self.info.namespace, self.info.name


class Mounting(Protocol):
    """The mount by name of agent/node/mounting.py (agent/node/ wires this package, so
    it is not imported back)."""

    def mount_pod(
        self, namespace: str, pod: str, request: MountRequest, user: str,
        found: PodInfo | None = None,
    ) -> MountResult: ...  # fmt: skip


@dataclass(frozen=True)
class HandOver:
    engine: Engine
    metrics: OnDemandMetrics
    mounting: Mounting
    suspending: Suspending

    def held(self, tracked: Tracked) -> list[str]:
        """The GPUs mounted in the pod's container now (suspended ones are not)."""
        record = self.engine.mounts.record(tracked.container_id)
        if record is None:
            return []
        gpus = {d.key for d in self.engine.inventory.devices if gpu_uuid(d)}
        return sorted(k for k in record.devices if k in gpus)

    def suspended_model(self, tracked: Tracked) -> str | None:
        record = self.engine.mounts.record(tracked.container_id)
        if record is None or not record.suspended:
            return None
        return next(iter(record.suspended.values())).model

    def gpu_count(self) -> int:
        return len({u for d in self.engine.inventory.devices if (u := gpu_uuid(d)) and not d.mig})

    def attach(self, tracked: Tracked, onto: list[str]) -> dict[str, str]:
        """Resume the pod's suspended GPUs onto `onto`, or mount them as its first: the
        pins made as a mount by name makes them. What the resume moved (old -> new)."""
        namespace, pod = tracked.key
        record = self.engine.mounts.record(tracked.container_id)
        if record is not None and record.suspended:
            done = self.suspending.resume_pod(namespace, pod, tracked.container, onto,
                                              tracked.caller, tracked.info)  # fmt: skip
            self.metrics.attaches.labels("resume").inc()
            return done.resumed
        self.mounting.mount_pod(
            namespace, pod, MountRequest(devices=onto, container=tracked.container),
            tracked.caller, tracked.info,
        )  # fmt: skip
        self.metrics.attaches.labels("first").inc()
        return {}

    def free(self, waiter: Tracked) -> list[Candidate]:
        """Whole GPUs no one holds, as `waiter` sees them: no hot-mount's, none the kubelet
        gave a pod (an ordinary GPU pod's, or another notebook's pin), one name each. A GPU
        NVML cannot name is left out: a suspended pod resumes only onto its own model."""
        seen: set[str] = set()
        free = []
        for gpu in self.engine.suspender.free_gpus(
            self.suspending.allocated_elsewhere(waiter.info)
        ):
            if gpu.model and gpu.uuid not in seen:
                seen.add(gpu.uuid)
                free.append(gpu)
        return free

    def suspend(self, tracked: Tracked, why: str) -> None:
        """Suspend the pod's GPUs, its processes kept (and taken from whatever holds them:
        the pod asked for this when it asked for on-demand GPUs); its pins go with them."""
        namespace, pod = tracked.key
        self.suspending.suspend_pod(
            namespace, pod, tracked.container, LOCK_TIMEOUT, f"on-demand ({why})",
            lambda target, holders: None, tracked.info,
        )  # fmt: skip
        self.metrics.suspends.labels(why).inc()
