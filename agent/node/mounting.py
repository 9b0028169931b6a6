"""Mount and unmount: named devices or a count into a pod's containers, and devices
into standalone containers (--no-kubernetes), with the Events that tell the pod.

Everything here is synchronous and runs in FastAPI's thread pool; the engine is the
only thing that touches the kernel.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from agent.books.holders import HolderPods
from agent.books.kubelet import KubeletBooks
from agent.books.pins import Pins, pin_metadata, pin_of
from agent.common.locks import ContainerLocks
from agent.common.results import (
    ONCE,
    label,
    measure,
    meta,
    mount_result,
    record_event,
    unclassified_text,
    workload_of,
)
from agent.common.targets import Targets
from agent.errors import BadRequest, PodNotRunning, UpstreamError
from agent.idle import policy as idle
from agent.idle.reclaim import IdleReclaim
from agent.kube.client import ContainerInfo, KubeClient, PodInfo
from agent.metrics import Metrics
from agent.node.desired import DesiredMount, DesiredMounts, difference
from agent.node.remounts import forget_devices
from hotmount.api import DeviceKind, Engine, HotmountError, now, rdma_for
from hotmount.api import MountResult as EngineMountResult
from hotmount.wire.durations import format_duration
from hotmount.wire.results import container_id_of, pod_of, unmount_result
from hotmount.wire.schemas import ContainerMount, MountRequest, MountResult, UnmountResult

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Mounting:
    engine: Engine
    kube: KubeClient | None
    metrics: Metrics
    locks: ContainerLocks
    targets: Targets
    kubelet: KubeletBooks
    holders: HolderPods
    pins: Pins
    idle_reclaim: IdleReclaim
    desired: DesiredMounts

    def mount_pod(
        self,
        namespace: str,
        pod: str,
        request: MountRequest,
        user: str,
        found: PodInfo | None = None,
    ) -> MountResult:
        """`found`: the pod, as the route's placement looked it up (on this node)."""
        with measure(self.metrics, "mount"):
            wanted = request.container_names()
            info, containers = self.targets.containers(namespace, pod, wanted, found)
            group = f"{namespace}/{pod}"  # containers of one pod share without asking
            share = self.targets.share_group(info, request)
            extra = self.idle_reclaim.idle_meta(request, info.annotations)
            if request.once:
                extra = {**extra, ONCE: "true"}
            if request.count is not None:
                if len(containers) > 1:
                    raise BadRequest("count mounts into one container; name one, not several")
                [container] = containers
                metadata = {**meta(info, container, user), **extra}
                assert container.container_id is not None
                with self.locks.hold(container.container_id):
                    result = self._mount_by_count(
                        info, container, request.count, metadata, request.with_driver
                    )
                done = [(container, result)]
            else:
                assert request.devices is not None
                devices = self.engine.inventory.resolve_all(request.devices)
                rdma = request.rdma_options()
                if not request.force:
                    # The RDMA devices the engine will add ride along unnamed: the
                    # kubelet's books are checked for them as for the GPUs.
                    riders = rdma_for(
                        self.engine.inventory, devices, rdma["with_rdma"], rdma["rdma"] or ()
                    )
                    checked = [*devices, *(nic for nic, _ in riders.values())]
                    self.kubelet.refuse_allocated(checked, info, share)
                keys = [d.key for d in devices]
                with self.pins.pinned(info, devices, share, request.force) as pins:
                    done = self._mount_each(
                        info,
                        containers,
                        keys,
                        request.force,
                        user,
                        group,
                        share,
                        extra,
                        rdma=rdma,
                        device_metadata={k: pin_metadata(h) for k, h in pins.items()},
                        with_driver=request.with_driver,
                    )
                for _, each in done:
                    for d in each.mounted + each.already_mounted:
                        d.pin = pins[d.key].name if d.key in pins else None
            timeout = idle.timeout_of(extra)
            for container, each in done:
                for d in each.mounted:
                    d.idle_timeout = format_duration(timeout) if timeout else None
                if each.mounted:
                    names = ", ".join(label(d) for d in each.mounted)
                    record_event(
                        self.kube,
                        info,
                        "GPUMounted",
                        f"hot-mounted {names} into {container.name} for {user}",
                    )
            first = done[0][1]
            if len(done) > 1:
                first.containers = [
                    ContainerMount(
                        container=r.container,
                        container_id=r.container_id,
                        mounted=r.mounted,
                        already_mounted=r.already_mounted,
                        driver=r.driver,
                    )
                    for _, r in done
                ]
            return first

    def _mount_by_count(
        self,
        target: PodInfo,
        container: ContainerInfo,
        count: int,
        metadata: dict[str, str],
        with_driver: bool | None = None,
    ) -> MountResult:
        with self.holders.new(target, count) as holder:
            keys = self.kubelet.holder_devices(target.namespace, holder.name)
            if len(keys) != count:
                raise UpstreamError(
                    f"holder pod {holder.name} got {len(keys)} devices from the kubelet, "
                    f"not {count}"
                )
            assert container.container_id is not None
            done = self.engine.mount(
                container.container_id,
                keys,
                metadata={**metadata, "holder": holder.name, "holderUid": holder.uid},
                workload=workload_of(target, container),
                group=f"{target.namespace}/{target.name}",
                with_driver=with_driver,
            )
        result = mount_result(done, target, container)
        result.holder_pod = holder.name
        return result

    def _mount_each(
        self,
        info: PodInfo,
        containers: list[ContainerInfo],
        keys: list[str],
        force: bool,
        user: str,
        group: str,
        share: str | None,
        extra: dict[str, str] | None = None,
        rdma: dict[str, Any] | None = None,
        device_metadata: dict[str, dict[str, str]] | None = None,
        with_driver: bool | None = None,
    ) -> list[tuple[ContainerInfo, MountResult]]:
        """The same devices into each container, or into none: a failure rolls back the
        containers this call already mounted."""
        done: list[tuple[ContainerInfo, EngineMountResult]] = []
        try:
            for container in containers:
                assert container.container_id is not None
                with self.locks.hold(container.container_id):
                    result = self.engine.mount(
                        container.container_id,
                        keys,
                        force=force,
                        metadata={**meta(info, container, user), **(extra or {})},
                        workload=workload_of(info, container),
                        group=group,
                        share_with=share,
                        device_metadata=device_metadata,
                        with_driver=with_driver,
                        **(rdma or {}),
                    )
                done.append((container, result))
        except BaseException:
            for container, result in reversed(done):
                if not result.mounted:
                    continue
                assert container.container_id is not None
                try:
                    with self.locks.hold(container.container_id):
                        self.engine.unmount(container.container_id, [m.key for m in result.mounted])
                except HotmountError as exc:
                    log.error("rollback from %s failed: %s", container.name, exc.message)
            raise
        results = [(c, mount_result(r, info, c)) for c, r in done]
        for _, converted in results:
            for mounted in converted.mounted:
                mounted.shared_with = pod_of(share)
        return results

    def unmount_pod(
        self,
        namespace: str,
        pod: str,
        devices: list[str] | None,
        *,
        container: str | None,
        force: bool,
        user: str,
        keep_holders: bool = False,
        found: PodInfo | None = None,
    ) -> UnmountResult:
        """`keep_holders`: a move hands the pin over instead of deleting it; `found`: the
        pod, as the route's placement looked it up (on this node)."""
        with measure(self.metrics, "unmount"):
            try:
                info, chosen = self.targets.container(namespace, pod, container, found)
            except PodNotRunning:
                kept = self._unmount_kept(namespace, pod, container, devices)
                if kept is None:
                    raise
                return kept
            assert chosen.container_id is not None
            with self.locks.hold(chosen.container_id):
                holders = self.holders.named_in(chosen.container_id)
                result = self.engine.unmount(chosen.container_id, devices, force=force)
            # With the container's lock released: waiting for the pods to go (up to
            # --holder-timeout) holds no other call on the container.
            released = [] if keep_holders else self.holders.release(namespace, holders)
            out = unmount_result(result, chosen.container_id, namespace, pod, chosen.name)
            out.holder_pods_deleted = released
            if result.unmounted:
                names = ", ".join(result.unmounted)
                record_event(
                    self.kube,
                    info,
                    "GPUUnmounted",
                    f"took {names} from {chosen.name} for {user}{unclassified_text(result)}",
                    warning=bool(result.unclassified_pids),
                )
            return out

    def _unmount_kept(
        self, namespace: str, pod: str, container: str | None, devices: list[str] | None
    ) -> UnmountResult | None:
        """An unmount while the container is down after a crash: what its successor was
        to get again is dropped, and the pins and holders nothing names any more go."""
        keys = (
            None if devices is None else {d.key for d in self.engine.inventory.resolve_all(devices)}
        )
        intents = self.holders.intents
        before = {h for ns, h in intents.named_holders() if ns == namespace}
        forgotten = forget_devices(intents, namespace, pod, container, keys)
        if forgotten is None:
            return None
        old_id, taken = forgotten
        released = self.holders.release(namespace, before)
        return UnmountResult(
            namespace=namespace,
            pod=pod,
            container=container,
            container_id=old_id,
            unmounted=taken,
            not_mounted=sorted((keys or set()) - set(taken)),
            stopped_pids=[],
            holder_pods_deleted=released,
        )

    def apply_pod(
        self,
        namespace: str,
        pod: str,
        spec: dict[str, Any],
        annotations: dict[str, str],
        user: str,
        found: PodInfo | None = None,
    ) -> DesiredMount:
        """Make the pod's container have what `spec` says (kubectl apply): mount what is
        missing first, then unmount what is not wanted, so a failed mount changes
        nothing; then keep the spec. The spec's other fields (idleTimeout, shareWith, ...)
        apply to what it mounts."""
        request = MountRequest.model_validate(spec)
        names = request.container_names()
        if len(names) != 1 or names == ["*"]:
            raise BadRequest("a GPUMount spec names one container (container), or none")
        info, container = self.targets.container(namespace, pod, names[0], found)
        assert container.container_id is not None
        named, by_count = self._mounted(container.container_id)
        wanted = (
            [d.key for d in self.engine.inventory.resolve_all(request.devices)]
            if request.devices is not None
            else None
        )
        change = difference(wanted, request.count, named, by_count)
        one = {"container": container.name, "containers": None}
        if change.mount:
            by_name = request.model_copy(update={**one, "devices": change.mount})
            self.mount_pod(namespace, pod, by_name, user, found)
        if change.mount_count:
            again = request.model_copy(update={**one, "count": change.mount_count})
            self.mount_pod(namespace, pod, again, user, found)
        if change.unmount:
            self.unmount_pod(
                namespace,
                pod,
                change.unmount,
                container=container.name,
                force=False,
                user=user,
                found=found,
            )
        before = self.desired.get(namespace, pod, info.uid)
        desired = DesiredMount(
            namespace=namespace,
            pod=pod,
            uid=info.uid,
            spec=spec,
            annotations=annotations,
            created=before.created if before else now(),
        )
        self.desired.put(desired)
        return desired

    def _mounted(self, container_id: str) -> tuple[list[str], list[str]]:
        """The GPUs hot-mounted into a container: by name, and by count (oldest first).
        RDMA devices are left out: they come and go with their GPUs."""
        record = self.engine.mounts.record(container_id)
        devices = sorted(record.devices.values(), key=lambda d: d.mounted_at) if record else []
        gpus = [d for d in devices if d.kind != str(DeviceKind.RDMA)]
        by_count = [d.key for d in gpus if d.metadata.get("holder") and not pin_of(d.metadata)]
        return [d.key for d in gpus if d.key not in by_count], by_count

    # -- standalone containers
    def mount_container(self, container_id: str, request: MountRequest) -> MountResult:
        if request.count is not None:
            raise BadRequest("mounting by count needs Kubernetes (the scheduler keeps the books)")
        assert request.devices is not None
        extra = self.idle_reclaim.idle_meta(request, {})
        with measure(self.metrics, "mount"), self.locks.hold(container_id):
            done = self.engine.mount(
                container_id,
                request.devices,
                force=request.force,
                metadata={"container_id": container_id, **extra},
                with_driver=request.with_driver,
                **request.rdma_options(),
            )
        return mount_result(done, None, None)

    def unmount_container(
        self, container_id: str, devices: list[str] | None, force: bool
    ) -> UnmountResult:
        with measure(self.metrics, "unmount"), self.locks.hold(container_id):
            done = self.engine.unmount(container_id, devices, force=force)
        return unmount_result(done, container_id_of(done, container_id))
