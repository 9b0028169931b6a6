"""Suspend and resume a pod's hot-mounted GPUs (hotmount/suspend/): the engine's steps
under the container's agent lock, the holder and pin pods that kept the GPUs in the
scheduler's books released on suspend, the Events that tell the pod, the metric.

Resume avoids GPUs the kubelet gave another running pod; it does not make a new pin
(docs/api.md says so): a resumed GPU is in the engine's claims, not in the scheduler's
books, as with a forced mount.
"""

from __future__ import annotations

from dataclasses import dataclass

from agent.errors import AllocatedToPod
from agent.kube.client import KubeClient, PodInfo
from agent.metrics import Metrics
from agent.node.holders import HolderPods
from agent.node.kubelet import KubeletBooks
from agent.node.locks import ContainerLocks
from agent.node.results import measure, record_event
from agent.node.targets import Targets
from agent.schemas import CheckpointedProcess, ResumeResult, SuspendResult
from hotmount import engine as eng


@dataclass(frozen=True)
class Suspending:
    engine: eng.Engine
    kube: KubeClient | None
    metrics: Metrics
    locks: ContainerLocks
    targets: Targets
    kubelet: KubeletBooks
    holders: HolderPods

    def __post_init__(self) -> None:
        ledger = self.engine.ledger
        self.metrics.suspended_gpus.set_function(
            lambda: sum(len(r.suspended) for r in ledger.records())
        )

    def suspend_pod(
        self, namespace: str, pod: str, container: str | None, lock_timeout: float, user: str
    ) -> SuspendResult:
        with measure(self.metrics, "suspend"):
            info, chosen = self.targets.container(namespace, pod, container)
            assert chosen.container_id is not None
            with self.locks.hold(chosen.container_id):
                holders = self.holders.named_in(chosen.container_id)
                done = self.engine.suspender.suspend(chosen.container_id, lock_timeout=lock_timeout)
                released = self.holders.release(namespace, holders)
            processes = [CheckpointedProcess(pid=p["pid"], gpu_bytes=p["gpuBytes"])
                         for p in done.processes]  # fmt: skip
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
        self, namespace: str, pod: str, container: str | None, onto: list[str] | None, user: str
    ) -> ResumeResult:
        with measure(self.metrics, "resume"):
            info, chosen = self.targets.container(namespace, pod, container)
            assert chosen.container_id is not None
            with self.locks.hold(chosen.container_id):
                done = self.engine.suspender.resume(
                    chosen.container_id,
                    onto=[self.engine.inventory.resolve(ref).key for ref in onto or []] or None,
                    unavailable=self._allocated_elsewhere(info),
                )
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
                processes=[
                    CheckpointedProcess(pid=p["pid"], gpu_bytes=p["gpuBytes"])
                    for p in done.processes
                ],
            )

    def _allocated_elsewhere(self, target: PodInfo) -> frozenset[str]:
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
