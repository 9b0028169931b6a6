"""Suspend and resume a pod's hot-mounted GPUs (hotmount/suspend/): the engine's steps
under the container's agent lock, the holder and pin pods that kept the GPUs in the
scheduler's books released on suspend, the Events that tell the pod, the metric.

Resume puts the GPUs back into the books as a mount by name does: it avoids GPUs the
kubelet gave another running pod, asks the engine which GPUs it would mount, pins each
through the mount by name's own path (`Pins.pinned`: a device plugin's pin, a DRA pin,
none for a GPU no one else manages), and only then mounts and restores, recording the
pin with the mount. A pin refused for a GPU the kubelet gave away meanwhile: another
free GPU of the model is tried; any other refusal (the quota full) is a 409 PinRefused.
Either way the pins made are deleted and the suspension stays as it was. After a crash
the ledger's suspension steps decide (hotmount/engine/suspension.py): a resume rolled back
leaves its pin named by nothing, and reconcile deletes it (at once if the mount had
named it, after the orphan grace if not); a resume finished keeps it with the mount.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from agent.books.holders import Holder, HolderPods
from agent.books.kubelet import KubeletBooks
from agent.books.pins import HOLDER_KIND, Pins, pin_metadata
from agent.common.locks import ContainerLocks
from agent.common.results import device_label, measure, record_event
from agent.common.targets import Targets
from agent.errors import AllocatedToPod, PinRefused, QuotaExceeded, Unschedulable
from agent.kube.client import KubeClient, PodInfo
from agent.metrics import Metrics
from agent.suspend.progress import InFlight, Op
from hotmount.api import Device, DeviceClaimed, DeviceRecord, Engine, Listed, NoGpuFree, Progress
from hotmount.api import ResumeResult as EngineResumeResult
from hotmount.wire.schemas import (
    CheckpointedProcess,
    OperationProgress,
    ResumeResult,
    SuspendResult,
)

# The caller's check before a suspend takes a pod's GPUs from the processes holding them.
TakeHeld = Callable[[PodInfo, int], None]
# A pin refused because the GPU is no longer free: the resume tries another GPU of the
# model (the engine's choice excludes the refused one), at most this often.
PIN_ATTEMPTS = 4


@dataclass(frozen=True)
class Suspending:
    engine: Engine
    kube: KubeClient | None
    metrics: Metrics
    locks: ContainerLocks
    targets: Targets
    kubelet: KubeletBooks
    holders: HolderPods
    pins: Pins
    in_flight: InFlight = field(default_factory=InFlight)  # what GET .../suspend answers

    def __post_init__(self) -> None:
        mounts = self.engine.mounts
        self.metrics.suspended_gpus.set_function(
            lambda: sum(len(r.suspended) for r in mounts.records())
        )

    def suspend_pod(
        self,
        namespace: str,
        pod: str,
        container: str | None,
        lock_timeout: float,
        user: str,
        may_take: TakeHeld,
        found: PodInfo | None = None,
    ) -> SuspendResult:
        """`may_take(pod, n)`: the caller's check before the suspension takes the GPUs
        from the `n` processes found holding them (the routes': `force` on the pod);
        raising refuses it with nothing changed. Not asked when no process holds them.
        `found`: the pod, as the route's placement looked it up (on this node)."""
        with measure(self.metrics, "suspend"):
            info, chosen = self.targets.container(namespace, pod, container, found)
            assert chosen.container_id is not None
            with (
                self.locks.hold(chosen.container_id),
                self.in_flight.track(namespace, pod, "suspend", chosen.name) as progress,
            ):
                holders = self.holders.named_in(chosen.container_id)
                done = self.engine.suspender.suspend(
                    chosen.container_id,
                    lock_timeout=lock_timeout,
                    progress=progress,
                    held=lambda processes: may_take(info, len(processes)),
                )
            # With the container's lock released: waiting for the pods to go (up to
            # --holder-timeout) holds no other call on the container.
            released = self.holders.release(namespace, holders)
            processes = _checkpointed(done.processes)
            moved = sum(p.gpu_bytes for p in processes)
            record_event(
                self.kube,
                info,
                "GPUSuspended",
                f"suspended {', '.join(done.devices)} of {chosen.name} for {user}: "
                f"{len(processes)} processes kept, {moved >> 20} MiB of GPU memory in host memory",
            )
            return SuspendResult(
                namespace=namespace,
                pod=pod,
                container=chosen.name,
                container_id=chosen.container_id,
                suspended=done.devices,
                processes=processes,
                host_bytes=moved,
                holder_pods_deleted=released,
            )

    def resume_pod(
        self,
        namespace: str,
        pod: str,
        container: str | None,
        onto: list[str] | None,
        user: str,
        found: PodInfo | None = None,
    ) -> ResumeResult:
        with measure(self.metrics, "resume"):
            info, chosen = self.targets.container(namespace, pod, container, found)
            assert chosen.container_id is not None
            wanted = [self.engine.inventory.resolve(ref).key for ref in onto or []] or None
            with (
                self.locks.hold(chosen.container_id),
                self.in_flight.track(namespace, pod, "resume", chosen.name) as progress,
            ):
                done = self._resume_pinned(info, chosen.container_id, wanted, progress)
            pairs = ", ".join(old if old == new else f"{old} onto {new}"
                              for old, new in done.onto.items())  # fmt: skip
            record_event(
                self.kube, info, "GPUResumed", f"resumed {pairs} in {chosen.name} for {user}"
            )
            return ResumeResult(
                namespace=namespace,
                pod=pod,
                container=chosen.name,
                container_id=chosen.container_id,
                resumed=done.onto,
                processes=_checkpointed(done.processes),
            )

    def _resume_pinned(
        self,
        target: PodInfo,
        container_id: str,
        wanted: list[str] | None,
        progress: Progress,
    ) -> EngineResumeResult:
        """The engine's resume onto GPUs pinned first (the pins deleted again if it fails):
        a GPU whose pin is refused because it is taken is left out of the next choice."""
        suspender = self.engine.suspender
        unavailable = self.allocated_elsewhere(target)
        for _ in range(PIN_ATTEMPTS):
            plan = suspender.plan(container_id, onto=wanted, unavailable=unavailable)
            old = self._suspended(container_id)
            devices = [self.engine.inventory.resolve(new) for new in plan.values()]
            first = old[next(iter(plan))]
            try:
                with self.pins.pinned(target, devices, first.shared_with, False) as made:
                    records = {plan[o]: _kept_kind(h, old[o]) for o, h in _by_old(plan, made)}
                    return suspender.resume(
                        container_id, onto=list(plan.values()), unavailable=unavailable,
                        pins=records, progress=progress,
                    )  # fmt: skip
            except (Unschedulable, AllocatedToPod, DeviceClaimed, NoGpuFree) as exc:
                taken = self._taken(target, plan, unavailable)
                if wanted or not taken:
                    if isinstance(exc, NoGpuFree):
                        raise  # the GPU went to a hot-mount: the engine's own answer
                    raise _refused(devices, exc) from exc
                unavailable |= taken
            except QuotaExceeded as exc:
                raise _refused(devices, exc) from exc
        raise PinRefused(
            f"no GPU of the suspended model could be pinned in {PIN_ATTEMPTS} tries: each was "
            "taken as it was pinned; the suspension is kept as it was"
        )

    def _suspended(self, container_id: str) -> dict[str, DeviceRecord]:
        record = self.engine.mounts.record(container_id)
        return {k: s.device for k, s in record.suspended.items()} if record else {}

    def _taken(
        self, target: PodInfo, plan: dict[str, str], unavailable: frozenset[str]
    ) -> frozenset[str]:
        """The GPUs of `plan` found taken since it was made: given by the kubelet to
        another pod, or claimed by a hot-mount. With one GPU in the plan and no such
        finding, that GPU (its pin was refused for it alone)."""
        chosen = set(plan.values())
        held = set(self.engine.holders())
        taken = (self.allocated_elsewhere(target) | held) & chosen
        if not taken and len(chosen) == 1:
            taken = frozenset(chosen)
        return frozenset(taken - unavailable)

    def progress(
        self, namespace: str, pod: str, op: Op, container: str | None, located: bool = False
    ) -> OperationProgress:
        """The suspend or resume of the pod running here, if any. Unless the route's
        placement `located` the pod on this node already, one that is not running here
        must be this node's pod (NotOnThisNode otherwise)."""
        found = self.in_flight.look(namespace, pod, op, container)
        if not found.running and not located:
            self.targets.node_check(namespace, pod)
        return found

    def running(self, namespace: str, pod: str, op: Op, container: str | None) -> bool:
        """Whether that suspend or resume runs here now: then its progress is answered here
        with no look at the pod (a polled GET costs the API server nothing)."""
        return self.in_flight.look(namespace, pod, op, container).running

    def allocated_elsewhere(self, target: PodInfo) -> frozenset[str]:
        """GPUs the kubelet gave another running pod: never resumed onto."""
        taken = set()
        for device in self.engine.inventory.devices:
            if device.uuid is None and "=GPU-" not in device.key:
                continue
            try:
                self.kubelet.refuse_allocated([device], target)
            except AllocatedToPod:
                taken.add(device.key)
        return frozenset(taken)


def _checkpointed(processes: list[Listed]) -> list[CheckpointedProcess]:
    """The engine's processes as a tenant sees them: by their PID in the container (the
    host's PID is the node's business, kept in the ledger and the agent's log)."""
    return [
        CheckpointedProcess(pid=p["containerPid"], gpu_bytes=p["gpuBytes"] or 0) for p in processes
    ]


def _by_old(plan: dict[str, str], made: dict[str, Holder]) -> list[tuple[str, Holder]]:
    """(old key, pin) of each planned GPU that got a pin (a GPU no one else manages has
    none)."""
    return [(old, made[new]) for old, new in plan.items() if new in made]


def _kept_kind(pin: Holder, old: DeviceRecord) -> dict[str, str]:
    """What the mount records of its new pin: a GPU that was mounted by count stays one
    mounted by count (apply and move treat it so), its holder now the pin of this GPU."""
    recorded = pin_metadata(pin)
    if old.metadata.get("holder") and HOLDER_KIND not in old.metadata:
        del recorded[HOLDER_KIND]
    return recorded


def _refused(devices: list[Device], exc: Exception) -> PinRefused:
    why = getattr(exc, "message", str(exc))
    names = ", ".join(device_label(d) for d in devices)
    return PinRefused(
        f"cannot resume onto {names}: its pin in the scheduler's books was refused ({why}); "
        "the suspension is kept as it was"
    )
