"""The node service: pods to containers, the kubelet's books, holder pods, then the engine.

Everything here is synchronous and runs in FastAPI's thread pool; the engine is
the only thing that touches the kernel. A lock per container serialises
operations on one container; operations on different containers run side by
side, and two containers racing for one device meet at the engine's claim (one
wins, the other gets 409).
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from agent import idle
from agent.config import AgentSettings
from agent.errors import (
    AllocatedToPod,
    ApiError,
    BadRequest,
    NotOnThisNode,
    PodNotFound,
    PodNotRunning,
    Timeout,
    Unschedulable,
    UpstreamError,
)
from agent.kube.client import ContainerInfo, KubeClient, PodInfo
from agent.metrics import Metrics, MountSample
from agent.podresources import Allocation, PodResourcesClient, PodResourcesError
from agent.schemas import (
    ContainerDevices,
    ContainerMount,
    DeviceHolder,
    DeviceInfo,
    DeviceList,
    MountedDevice,
    MountRequest,
    MountResult,
    PodDevices,
    ReassignRequest,
    ReassignResult,
    UnmountResult,
)
from hotmount import claims, companions, usage
from hotmount import engine as eng
from hotmount.claims import Claim, Footprint
from hotmount.devices.model import Device
from hotmount.devices.rdma import RDMA_NODE_DIR, is_rdma
from hotmount.errors import DeviceBusy, HotmountError
from hotmount.ledger import ContainerRecord, DeviceRecord

log = logging.getLogger(__name__)

HOLDER_PREFIX = "hotmount-holder-"
HOLDER_LABEL = "hotmount.io/holder-for"
MANAGED_BY = ("app.kubernetes.io/managed-by", "gpu-hotmount")
HOLDER_SELECTOR = f"{MANAGED_BY[0]}={MANAGED_BY[1]},{HOLDER_LABEL}"


class NotMounted(ApiError):
    code, reason = 409, "NotMounted"


class MountedByCount(ApiError):
    """A count-mounted GPU is accounted for by a holder pod that cannot follow it."""

    code, reason = 409, "MountedByCount"


class NodeService:
    def __init__(
        self,
        settings: AgentSettings,
        engine: eng.Engine,
        kube: KubeClient | None,
        podresources: PodResourcesClient | None,
        metrics: Metrics,
    ) -> None:
        self.settings = settings
        self.engine = engine
        self.kube = kube
        self.podresources = podresources
        self.metrics = metrics
        self._locks: dict[str, threading.Lock] = defaultdict(threading.Lock)
        self._locks_guard = threading.Lock()
        # Holder pods of mounts in progress: reconcile never takes them for orphans.
        self._holders_in_flight: set[tuple[str, str]] = set()
        self._in_flight_guard = threading.Lock()
        # When reconcile first saw each orphan-looking holder (monotonic, no clock skew).
        self._orphans_seen: dict[tuple[str, str], float] = {}
        self._idle = idle.IdleClock()  # when each mount was first seen unheld
        metrics.watch_mounts(settings.node_name or "", self.mount_samples)

    # -- inventory
    def devices(self) -> DeviceList:
        """One entry per physical device, with everyone who holds it under any name."""
        hot = self.engine.holders()
        kubelet = self._kubelet_holds()
        inventory = self.engine.inventory
        near = {nic: [g.key for g in gpus] for nic, gpus in inventory.nearest_gpus().items()}
        nearest_rdma = {gpu: nic for nic, gpus in near.items() for gpu in gpus}
        infos = []
        for device in inventory.devices:
            mine = inventory.footprint(device)
            holders = [_hot_holder(c) for c in hot.get(device.key, [])]
            holders += [h.holder() for h in kubelet if h.footprint.overlaps(mine)]
            nic = nearest_rdma.get(device.key) or nearest_rdma.get(device.parent or "")
            infos.append(DeviceInfo.of(device, holders, near.get(device.key), nic))
        return DeviceList(node=self.settings.node_name, devices=infos)

    def _kubelet_holds(self, strict: bool = False) -> list[KubeletHold]:
        """What the kubelet gave each pod, as physical devices: an ID of any form (UUID,
        `UUID::n`, MIG UUID, index, CDI name) maps through the inventory. Empty without
        PodResources; an ID the inventory does not know is skipped. `strict`: a
        PodResources failure is an error (a check must fail closed, not read as free)."""
        if self.podresources is None:
            return []
        try:
            allocations = self.podresources.list_allocations()
        except PodResourcesError as exc:
            if strict:
                raise UpstreamError(
                    f"PodResources did not answer ({exc}), so the kubelet's allocations "
                    "cannot be checked; retry, or pass force to mount anyway"
                ) from exc
            log.warning("PodResources unavailable: %s", exc)
            return []
        holds = []
        for allocation in allocations:
            for device_id in allocation.device_ids:
                device = self.engine.inventory.kubelet_device(device_id)
                if device is None:
                    log.debug("kubelet device %s is not in the inventory", device_id)
                    continue
                holds.append(
                    KubeletHold(allocation, device_id, self.engine.inventory.footprint(device))
                )
        return holds

    # -- pods
    def target(
        self, namespace: str, pod: str, container: str | None
    ) -> tuple[PodInfo, ContainerInfo]:
        kube = self._kube()
        info = kube.get_pod(namespace, pod)
        if info.node_name and self.settings.node_name and info.node_name != self.settings.node_name:
            raise NotOnThisNode(
                f"pod {namespace}/{pod} runs on node {info.node_name}", info.node_name
            )
        if info.phase != "Running":
            raise PodNotRunning(f"pod {namespace}/{pod} is {info.phase}, not Running")
        chosen = info.container(container)
        if chosen is None:
            names = ", ".join(c.name for c in info.containers)
            raise PodNotFound(f"pod {namespace}/{pod} has no container {container!r} ({names})")
        if not chosen.running or not chosen.container_id:
            raise PodNotRunning(f"container {chosen.name} of pod {namespace}/{pod} is not running")
        return info, chosen

    def target_node_check(self, namespace: str, pod: str) -> PodInfo:
        """The pod exists and lives on this node (any phase)."""
        info = self._kube().get_pod(namespace, pod)
        if info.node_name and self.settings.node_name and info.node_name != self.settings.node_name:
            raise NotOnThisNode(
                f"pod {namespace}/{pod} runs on node {info.node_name}", info.node_name
            )
        return info

    def targets(
        self, namespace: str, pod: str, names: list[str | None]
    ) -> tuple[PodInfo, list[ContainerInfo]]:
        """The running containers a mount names: one, several, or `*` for all of them."""
        info, first = self.target(namespace, pod, None if names == ["*"] else names[0])
        chosen = list(info.containers) if names == ["*"] else [first]
        for name in names[1:]:
            found = info.container(name)
            if found is None:
                have = ", ".join(c.name for c in info.containers)
                raise PodNotFound(f"pod {namespace}/{pod} has no container {name!r} ({have})")
            chosen.append(found)
        for container in chosen:
            if not container.running or not container.container_id:
                raise PodNotRunning(
                    f"container {container.name} of pod {namespace}/{pod} is not running"
                )
        return info, chosen

    def mount_pod(self, namespace: str, pod: str, request: MountRequest, user: str) -> MountResult:
        with self._measure("mount"):
            info, containers = self.targets(namespace, pod, request.container_names())
            group = f"{namespace}/{pod}"  # containers of one pod share without asking
            share = self._share_group(info, request)
            extra = self._idle_meta(request, info.annotations)
            if request.count is not None:
                if len(containers) > 1:
                    raise BadRequest("count mounts into one container; name one, not several")
                [container] = containers
                meta = {**_meta(info, container, user), **extra}
                assert container.container_id is not None
                with self._lock(container.container_id):
                    result = self._mount_by_count(info, container, request.count, meta)
                done = [(container, result)]
            else:
                assert request.devices is not None
                devices = self.engine.inventory.resolve_all(request.devices)
                rdma = request.rdma_options()
                if not request.force:
                    # The RDMA devices the engine will add ride along unnamed: the
                    # kubelet's books are checked for them as for the GPUs.
                    riders = companions.rdma_for(
                        self.engine.inventory, devices, rdma["with_rdma"], rdma["rdma"] or ()
                    )
                    checked = [*devices, *(nic for nic, _ in riders.values())]
                    self._refuse_kubelet_allocated(checked, info, share)
                keys = [d.key for d in devices]
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
                )
            timeout = idle.timeout_of(extra)
            for container, each in done:
                for d in each.mounted:
                    d.idle_timeout = idle.format_duration(timeout) if timeout else None
                if each.mounted:
                    names = ", ".join(_label(d) for d in each.mounted)
                    self._event(
                        info, "GPUMounted", f"hot-mounted {names} into {container.name} for {user}"
                    )
            first = done[0][1]
            if len(done) > 1:
                first.containers = [
                    ContainerMount(
                        container=r.container,
                        container_id=r.container_id,
                        mounted=r.mounted,
                        already_mounted=r.already_mounted,
                    )
                    for _, r in done
                ]
            return first

    def _share_group(self, target: PodInfo, request: MountRequest) -> str | None:
        """`shareWith`: a pod of the target's own namespace (never another's), by name."""
        other = request.share_with
        if other is None:
            return None
        if request.count is not None:
            raise BadRequest("shareWith shares named devices; a count gets fresh ones")
        if other == target.name:
            raise BadRequest(
                "shareWith names another pod; the containers of one pod share without it"
            )
        self._kube().get_pod(target.namespace, other)  # 404 for a pod that is not there
        return f"{target.namespace}/{other}"

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
    ) -> list[tuple[ContainerInfo, MountResult]]:
        """The same devices into each container, or into none: a failure rolls back the
        containers this call already mounted."""
        done: list[tuple[ContainerInfo, eng.MountResult]] = []
        try:
            for container in containers:
                assert container.container_id is not None
                with self._lock(container.container_id):
                    result = self.engine.mount(
                        container.container_id,
                        keys,
                        force=force,
                        metadata={**_meta(info, container, user), **(extra or {})},
                        group=group,
                        share_with=share,
                        **(rdma or {}),
                    )
                done.append((container, result))
        except BaseException:
            for container, result in reversed(done):
                if not result.mounted:
                    continue
                assert container.container_id is not None
                try:
                    with self._lock(container.container_id):
                        self.engine.unmount(container.container_id, [m.key for m in result.mounted])
                except HotmountError as exc:
                    log.error("rollback from %s failed: %s", container.name, exc.message)
            raise
        results = [(c, _mount_result(r, info, c)) for c, r in done]
        for _, result in results:
            for mounted in result.mounted:
                mounted.shared_with = _pod_of(share)
        return results

    def _refuse_kubelet_allocated(
        self, devices: list[Device], target: PodInfo, share: str | None = None
    ) -> None:
        """409 for a device whose physical GPU the kubelet gave another running pod, under
        any name; the pod named in `shareWith` (or its sharing circle) is no obstacle."""
        holds = self._kubelet_holds(strict=True)
        if not holds:
            return
        group = f"{target.namespace}/{target.name}"
        held = [*self.engine.ledger.claims(), *(h.claim() for h in holds)]
        for device in devices:
            new = Claim("", device.key, group, self.engine.inventory.footprint(device))
            for blocker in claims.blocking(new, held, share):
                if not blocker.owner.startswith(KUBELET):
                    continue  # a hot-mount: the engine's claim decides, atomically
                owner = (blocker.holder["namespace"], blocker.holder["pod"])
                other = self._kube().find_pod(*owner)
                if other is None or other.phase not in ("Running", "Pending"):
                    continue
                if (
                    other.labels.get(HOLDER_LABEL) == target.name
                    and other.namespace == target.namespace
                ):
                    continue  # our own holder for this very pod
                raise AllocatedToPod(
                    f"device {_device_label(device)} is the same physical device the kubelet "
                    f"allocated to running pod {owner[0]}/{owner[1]} (as {blocker.device}); "
                    "share it on purpose (shareWith), or pass force to mount it anyway",
                    {
                        "namespace": owner[0],
                        "pod": owner[1],
                        "holders": [{**dict(blocker.holder), "device": blocker.device}],
                    },
                )

    def _mount_by_count(
        self, target: PodInfo, container: ContainerInfo, count: int, meta: dict[str, str]
    ) -> MountResult:
        kube = self._kube()
        name = f"{HOLDER_PREFIX}{target.name[:40]}-{secrets.token_hex(3)}"
        in_flight = (target.namespace, name)
        with self._in_flight_guard:
            self._holders_in_flight.add(in_flight)
        try:
            created = kube.create_pod(target.namespace, self._holder_manifest(target, name, count))
            try:
                self._wait_running(target.namespace, name)
                keys = self._holder_devices(target.namespace, name)
                if len(keys) != count:
                    raise UpstreamError(
                        f"holder pod {name} got {len(keys)} devices from the kubelet, not {count}"
                    )
                assert container.container_id is not None
                done = self.engine.mount(
                    container.container_id,
                    keys,
                    metadata={**meta, "holder": name, "holderUid": created.uid},
                    group=f"{target.namespace}/{target.name}",
                )
            except BaseException:
                try:
                    kube.delete_pod(target.namespace, name)
                except ApiError as exc:  # reconcile collects it; the caller sees the cause
                    log.warning("could not delete holder pod %s: %s", name, exc.message)
                raise
        finally:
            # After the ledger holds the mount (or the holder is deleted): reconcile reads
            # the holders, then this set, then the ledger, so it never sees a gap.
            with self._in_flight_guard:
                self._holders_in_flight.discard(in_flight)
        result = _mount_result(done, target, container)
        result.holder_pod = name
        return result

    def _holder_manifest(self, target: PodInfo, name: str, count: int) -> dict[str, object]:
        resource = self.settings.gpu_resource
        spec: dict[str, object] = {
            "nodeSelector": {"kubernetes.io/hostname": target.node_name},
            "tolerations": [{"operator": "Exists"}],
            "restartPolicy": "Always",
            "terminationGracePeriodSeconds": 0,
            "automountServiceAccountToken": False,
            "enableServiceLinks": False,
            "containers": [
                {
                    "name": "holder",
                    "image": self.settings.holder_image,
                    "imagePullPolicy": "IfNotPresent",
                    "resources": {
                        "limits": {resource: str(count)},
                        "requests": {resource: str(count)},
                    },
                    "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "none"}],
                }
            ],
        }
        if self.settings.holder_priority_class:
            spec["priorityClassName"] = self.settings.holder_priority_class
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "namespace": target.namespace,
                "labels": {MANAGED_BY[0]: MANAGED_BY[1], HOLDER_LABEL: target.name},
                # Same namespace, not a controller: a cross-namespace owner would be
                # treated as absent and the holder garbage-collected (GPUMounter's bug).
                "ownerReferences": [
                    {
                        "apiVersion": "v1",
                        "kind": "Pod",
                        "name": target.name,
                        "uid": target.uid,
                        "controller": False,
                        "blockOwnerDeletion": False,
                    }
                ],
            },
            "spec": spec,
        }

    def _wait_running(self, namespace: str, name: str) -> None:
        deadline = time.monotonic() + self.settings.holder_timeout
        while True:
            pod = self._kube().find_pod(namespace, name)
            if pod is None:
                raise Unschedulable(f"holder pod {namespace}/{name} disappeared")
            if pod.phase == "Running":
                return
            if pod.unschedulable_message:
                raise Unschedulable(f"no room for {name}: {pod.unschedulable_message}")
            if pod.phase in ("Failed", "Succeeded"):
                raise Unschedulable(f"holder pod {name} was rejected ({pod.phase})")
            if time.monotonic() > deadline:
                raise Timeout(
                    f"holder pod {name} was not Running after {self.settings.holder_timeout:g}s"
                )
            time.sleep(0.2)

    def _holder_devices(self, namespace: str, name: str) -> list[str]:
        if self.podresources is None:
            raise UpstreamError("mounting by count needs the kubelet's PodResources socket")
        try:
            allocations = self.podresources.list_allocations()
        except PodResourcesError as exc:
            raise UpstreamError(f"PodResources: {exc}") from exc
        keys = []
        for a in allocations:
            if (a.pod_namespace, a.pod_name, a.resource_name) == (
                namespace,
                name,
                self.settings.gpu_resource,
            ):
                for device_id in a.device_ids:
                    device = self.engine.inventory.kubelet_device(device_id)
                    if device is None:
                        raise UpstreamError(
                            f"the kubelet gave {name} device {device_id}, "
                            "which is not in this node's inventory"
                        )
                    keys.append(device.key)
        return list(dict.fromkeys(keys))

    def unmount_pod(
        self,
        namespace: str,
        pod: str,
        devices: list[str] | None,
        *,
        container: str | None,
        force: bool,
        user: str,
    ) -> UnmountResult:
        with self._measure("unmount"):
            info, chosen = self.target(namespace, pod, container)
            assert chosen.container_id is not None
            with self._lock(chosen.container_id):
                holders = self._holders(chosen.container_id)
                result = self.engine.unmount(chosen.container_id, devices, force=force)
                released = self._release_holders(namespace, chosen.container_id, holders)
            out = UnmountResult(
                namespace=namespace,
                pod=pod,
                container=chosen.name,
                container_id=chosen.container_id,
                unmounted=result.unmounted,
                not_mounted=result.not_mounted,
                stopped_pids=result.stopped_pids,
                netdevs=result.netdevs,
            )
            out.holder_pods_deleted = released
            if result.unmounted:
                names = ", ".join(result.unmounted)
                self._event(info, "GPUUnmounted", f"took {names} from {chosen.name} for {user}")
            return out

    def _holders(self, container_id: str) -> set[str]:
        record = self.engine.ledger.load(container_id)
        if record is None:
            return set()
        return {h for d in record.devices.values() if (h := d.metadata.get("holder"))}

    def _release_holders(self, namespace: str, container_id: str, before: set[str]) -> list[str]:
        """Delete the holder pods none of whose devices is still mounted; wait until gone."""
        gone = sorted(before - self._holders(container_id))
        if self.kube is None or not gone:
            return []
        for pod in gone:
            self.kube.delete_pod(namespace, pod)
        deadline = time.monotonic() + self.settings.holder_timeout
        for pod in gone:
            while self.kube.find_pod(namespace, pod) is not None:
                if time.monotonic() > deadline:
                    raise Timeout(f"holder pod {pod} is still there after deletion")
                time.sleep(0.2)
        return gone

    def pod_devices(self, namespace: str, pod: str) -> PodDevices:
        self._kube().get_pod(namespace, pod)  # 404 for an unknown pod
        containers = []
        hot: dict[str, list[Claim]] | None = None
        kubelet: list[KubeletHold] | None = None
        for record in self.engine.ledger.records():
            devices = [
                d
                for d in record.devices.values()
                if d.metadata.get("namespace") == namespace and d.metadata.get("pod") == pod
            ]
            if devices:
                hot = hot if hot is not None else self.engine.holders()
                kubelet = kubelet if kubelet is not None else self._kubelet_holds()
                containers.append(
                    ContainerDevices(
                        container=devices[0].metadata.get("container"),
                        container_id=record.container_id or record.key,
                        devices=[
                            self._mounted_from_record(d, record.key, hot, kubelet) for d in devices
                        ],
                    )
                )
        return PodDevices(namespace=namespace, pod=pod, containers=containers)

    def namespace_mounts(self, namespace: str) -> list[PodDevices]:
        pods = sorted(
            {
                d.metadata["pod"]
                for r in self.engine.ledger.records()
                for d in r.devices.values()
                if d.metadata.get("namespace") == namespace and d.metadata.get("pod")
            }
        )
        out = []
        for pod in pods:
            try:
                out.append(self.pod_devices(namespace, pod))
            except PodNotFound:
                continue
        return out

    def _mounted_from_record(
        self,
        entry: DeviceRecord,
        owner: str,
        hot: dict[str, list[Claim]] | None = None,
        kubelet: list[KubeletHold] | None = None,
    ) -> MountedDevice:
        """A mounted device, with everyone else who holds the same physical device."""
        device = self.engine.inventory.get(entry.key)
        own = [n.path for n in device.nodes] if device else entry.node_paths
        others: list[DeviceHolder] = []
        if device is not None:
            mine = self.engine.inventory.footprint(device)
            claims_now = (hot or {}).get(device.key, [])
            others += [_hot_holder(c) for c in claims_now if c.owner != owner]
            others += [h.holder() for h in kubelet or [] if h.footprint.overlaps(mine)]
        timeout = idle.timeout_of(entry.metadata)
        idle_for = self._idle.idle_for(_clock_key(owner, entry), time.monotonic())
        return MountedDevice(
            key=entry.key,
            kind=entry.kind,
            index=device.index if device else None,
            uuid=device.uuid if device else None,
            paths=own,
            shared_with=_pod_of(entry.shared_with),
            other_holders=others,
            idle_timeout=idle.format_duration(timeout) if timeout is not None else None,
            idle_seconds=int(idle_for) if idle_for is not None else None,
        )

    def reassign(self, request: ReassignRequest, user: str) -> ReassignResult:
        with self._measure("reassign"):
            source_pod, source = self.target(
                request.from_.namespace, request.from_.pod, request.from_.container
            )
            target_pod, target = self.target(
                request.to.namespace, request.to.pod, request.to.container
            )
            device = self.engine.inventory.resolve(request.device)
            assert source.container_id is not None and target.container_id is not None
            record = self.engine.ledger.load(source.container_id)
            if record is None or device.key not in record.devices:
                raise NotMounted(
                    f"device {_device_label(device)} is not hot-mounted in "
                    f"{request.from_.namespace}/{request.from_.pod}"
                )
            source_entry = record.devices[device.key]
            source_meta = dict(source_entry.metadata)
            if source_meta.get("holder"):
                raise MountedByCount(
                    f"device {_device_label(device)} was mounted into "
                    f"{request.from_.namespace}/{request.from_.pod} by count: the kubelet "
                    f"counts it as holder pod {request.from_.namespace}/{source_meta['holder']}'s, "
                    "and a holder cannot follow it (the kubelet cannot be asked for one "
                    "particular GPU). Unmount it there, then mount by count into "
                    f"{request.to.namespace}/{request.to.pod}",
                    {"holderPod": source_meta["holder"]},
                )
            unmounted = self.unmount_pod(
                request.from_.namespace,
                request.from_.pod,
                [device.key],
                container=source.name,
                force=request.force,
                user=user,
            )
            try:
                mounted = self.mount_pod(
                    request.to.namespace,
                    request.to.pod,
                    MountRequest(container=target.name, devices=[device.key], force=request.force),
                    user,
                )
            except Exception as exc:
                self._roll_back(source.container_id, device, source_entry, request.force, exc)
                raise
            for pod in (source_pod, target_pod):
                self._event(
                    pod,
                    "GPUReassigned",
                    f"{_device_label(device)} moved from "
                    f"{source_pod.namespace}/{source_pod.name} to "
                    f"{target_pod.namespace}/{target_pod.name} for {user}",
                )
            return ReassignResult(
                device=device.key,
                from_=request.from_,
                to=request.to,
                unmounted=unmounted,
                mounted=mounted,
            )

    def _roll_back(
        self,
        container_id: str,
        device: Device,
        entry: DeviceRecord,
        force: bool,
        cause: Exception,
    ) -> None:
        """Put the device back as it was (its pod's group, its share). Forced only when the
        move was: whoever claimed the device in between keeps it, and the caller hears so."""
        try:
            with self._lock(container_id):
                self.engine.mount(
                    container_id,
                    [device.key],
                    force=force,
                    metadata=dict(entry.metadata),
                    group=entry.group,
                    share_with=entry.shared_with,
                )
        except HotmountError as exc:
            log.error(
                "reassign rollback of %s failed: %s (after %s)", device.key, exc.message, cause
            )
            if isinstance(cause, ApiError | HotmountError):
                cause_details = getattr(cause, "details", None) or {}
                if isinstance(cause, ApiError):
                    cause.details = {**cause_details, "rolledBack": False}
                else:
                    cause.message = (
                        f"{cause.message} (it could not go back to its source: {exc.message})"
                    )
            return
        log.warning("reassign of %s failed (%s); it went back to its source", device.key, cause)
        if isinstance(cause, ApiError):
            cause.details = {**(cause.details or {}), "rolledBack": True}
        elif isinstance(cause, HotmountError):
            cause.message = f"{cause.message} (the device went back to its source)"

    # -- standalone containers
    def mount_container(self, container_id: str, request: MountRequest) -> MountResult:
        if request.count is not None:
            raise BadRequest("mounting by count needs Kubernetes (the scheduler keeps the books)")
        assert request.devices is not None
        extra = self._idle_meta(request, {})
        with self._measure("mount"), self._lock(container_id):
            done = self.engine.mount(
                container_id,
                request.devices,
                force=request.force,
                metadata={"container_id": container_id, **extra},
                **request.rdma_options(),
            )
        return _mount_result(done, None, None)

    def unmount_container(
        self, container_id: str, devices: list[str] | None, force: bool
    ) -> UnmountResult:
        with self._measure("unmount"), self._lock(container_id):
            done = self.engine.unmount(container_id, devices, force=force)
        return UnmountResult(
            container_id=str(done.container.get("id") or container_id),
            unmounted=done.unmounted,
            not_mounted=done.not_mounted,
            stopped_pids=done.stopped_pids,
            netdevs=done.netdevs,
        )

    def container_devices(self, container_id: str) -> PodDevices:
        container = self.engine.resolve(container_id)
        record = self.engine.ledger.load(container.key)
        devices = list(record.devices.values()) if record else []
        return PodDevices(
            containers=[
                ContainerDevices(
                    container=None,
                    container_id=container.key,
                    devices=[self._mounted_from_record(d, container.key) for d in devices],
                )
            ]
        )

    # -- reconcile
    def reconcile(self) -> eng.ReconcileReport:
        report = self.engine.reconcile()
        repairs = {
            "grant": report.regranted,
            "wrapper": report.rewrapped,
            "node": report.recreated,
            "pending": report.pending_finished,
        }
        for kind, count in repairs.items():
            if count:
                self.metrics.drift_repairs.labels(kind).inc(count)
        self.metrics.managed_containers.set(len(self.engine.ledger.records()))
        self.metrics.reconciles.labels("error" if report.errors else "ok").inc()
        deleted = self.collect_orphan_holders()
        if deleted:
            self.metrics.orphan_holders.inc(len(deleted))
        self.take_back_unheld()
        self.reclaim_idle()
        return report

    # -- idle reclaim
    def _idle_meta(self, request: MountRequest, annotations: dict[str, str]) -> dict[str, str]:
        """Ledger metadata for idle reclaim: a fresh mount ID (its idle clock's key: a GPU
        unmounted and mounted again within a second must not inherit the old clock), and
        the idle timeout in seconds, if any: the request's, else the pod's annotation,
        else the node's default."""
        try:
            timeout = idle.choose_timeout(
                request.idle_timeout, annotations, self.settings.idle_timeout
            )
        except ValueError as exc:
            raise BadRequest(str(exc)) from exc
        meta = {idle.MOUNT_ID_KEY: secrets.token_hex(6)}
        if timeout is not None:
            meta[idle.TIMEOUT_KEY] = f"{timeout:g}"
        return meta

    def reclaim_idle(self) -> list[str]:
        """Look at every hot-mounted GPU; unmount those unheld for their idle timeout.

        The look: an fd scan of the container's processes for the GPU's own nodes (not
        the control nodes every GPU shares), then NVML's process list where NVML loads.
        The clock (agent/idle.py) starts at the first look that finds it unheld. The
        unmount runs under the container's lock and the engine checks for holders again
        (pidfds, then the scan): a process that opened the GPU since keeps it.
        """
        looked, due = [], []
        for record in self.engine.ledger.records():
            entries = [d for d in record.devices.values() if self._is_gpu(d)]
            if not entries:
                continue
            try:
                pids = self.engine.resolve(record.container_id or record.key).pids()
            except HotmountError:
                continue  # gone: the engine's reconcile forgets it
            for entry in entries:
                key = _clock_key(record.key, entry)
                held = self._held(record, entry, pids)
                now = time.monotonic()  # after the scan: conservative (agent/idle.py)
                since = self._idle.observe(key, held, now)
                looked.append(key)
                timeout = idle.timeout_of(entry.metadata)
                if since is not None and idle.should_reclaim(timeout, since, now, held):
                    due.append((record, entry, now - since))
        self._idle.retain(looked)
        taken = []
        for record, entry, idle_for in due:
            if self._reclaim(record, entry, idle_for):
                taken.append(entry.key)
        return taken

    def _is_gpu(self, entry: DeviceRecord) -> bool:
        """A GPU (or MIG, or another accelerator), not an RDMA device: one sysfs found
        (kind `rdma`) or one a CDI spec declares (kind `cdi`, verbs nodes), nor any
        device that came along with GPUs (it leaves with them, never idle on its own)."""
        if entry.with_devices or entry.kind == "rdma":
            return False
        device = self.engine.inventory.get(entry.key)
        if device is not None:
            return not is_rdma(device)
        return not any(p.startswith(RDMA_NODE_DIR) for p in entry.node_paths)

    def _held(self, record: ContainerRecord, entry: DeviceRecord, pids: list[int]) -> int:
        """How many of the container's processes hold the device (fd scan, then NVML)."""
        device = self.engine.inventory.get(entry.key)
        if device is not None:
            numbers = {(n.major, n.minor) for n in device.nodes}
        else:
            numbers = {
                (record.nodes[p].major, record.nodes[p].minor)
                for p in entry.node_paths
                if p in record.nodes
            }
        found = len(usage.holders(self.engine.host.proc, pids, numbers))
        if not found and device is not None and device.uuid and self.engine.config.use_nvml:
            found = len(usage.nvml_pids([device.uuid]) & set(pids))
        return found

    def _reclaim(self, record: ContainerRecord, entry: DeviceRecord, idle_for: float) -> bool:
        """Unmount one idle device under the container's lock, release its holder pod,
        and tell the pod (Event) and the metrics."""
        ref = record.container_id or record.key
        meta = entry.metadata
        namespace, pod_name = meta.get("namespace"), meta.get("pod")
        key = _clock_key(record.key, entry)
        try:
            with self._lock(ref):
                now = self.engine.ledger.load(record.key)
                current = now.devices.get(entry.key) if now else None
                if current is None or current.mounted_at != entry.mounted_at:
                    return False  # unmounted (or mounted anew) meanwhile
                before = self._holders(ref)
                self.engine.unmount(ref, [entry.key], force=False)
                released: list[str] = []
                if namespace:
                    try:
                        released = self._release_holders(namespace, ref, before)
                    except ApiError as exc:
                        log.warning("reclaim: holder pod release: %s", exc.message)
        except DeviceBusy as exc:
            self._idle.observe(key, 1, time.monotonic())  # opened meanwhile: held again
            log.info(
                "reclaim of %s from %s: in use, its idle clock restarts: %s",
                entry.key,
                ref,
                exc.message,
            )
            return False
        except HotmountError as exc:
            log.warning("cannot reclaim %s from %s: %s", entry.key, ref, exc.message)
            return False
        self._idle.forget(key)
        self.metrics.reclaimed.inc()
        timeout = idle.timeout_of(meta) or 0
        why = (
            f"idle for {idle.format_duration(idle_for)} (idle timeout "
            f"{idle.format_duration(timeout)})"
        )
        label = self._device_text(entry.key)
        log.info("reclaimed %s from %s: %s; holder pods deleted: %s", label, ref, why, released)
        if namespace and pod_name and self.kube is not None:
            try:
                pod = self.kube.find_pod(namespace, pod_name)
            except ApiError:
                pod = None
            if pod is not None:
                container = meta.get("container") or ref
                self._event(pod, "GPUReclaimed", f"took {label} back from {container}: {why}")
        return True

    def _device_text(self, key: str) -> str:
        device = self.engine.inventory.get(key)
        return f"GPU {_device_label(device)}" if device is not None else key

    def mount_samples(self) -> list[MountSample]:
        """Every hot-mounted GPU, for the per-mount gauges (read at scrape time)."""
        now = time.monotonic()
        samples = []
        for record in self.engine.ledger.records():
            for entry in record.devices.values():
                if not self._is_gpu(entry):
                    continue
                device = self.engine.inventory.get(entry.key)
                paths = [n.path for n in device.nodes] if device else entry.node_paths
                meta = entry.metadata
                samples.append(
                    MountSample(
                        gpu_uuid=(device.uuid if device else None) or "",
                        device=paths[0].rpartition("/")[2] if paths else entry.key,
                        namespace=meta.get("namespace", ""),
                        pod=meta.get("pod", ""),
                        container=meta.get("container") or record.container_id or record.key,
                        idle_seconds=self._idle.idle_for(_clock_key(record.key, entry), now),
                    )
                )
        return samples

    def take_back_unheld(self) -> list[str]:
        """Unmount GPUs mounted by count whose holder pod is gone or finished.

        The holder is what the kubelet counts the GPU against, and it lives in the
        tenant's namespace, where the tenant may delete it. Without it the scheduler sees
        the GPU free and may give it to another tenant's pod while this container still
        has it: so the GPU goes (forced: the books are already wrong). The holder is
        known by its uid too: a new pod the tenant gives the same name stands in for
        nothing. Holders of mounts
        in progress are skipped; the ledger is read again under the container's lock, so
        a mount that came meanwhile, with a new holder, is left alone.
        """
        if self.kube is None:
            return []
        with self._in_flight_guard:
            in_flight = set(self._holders_in_flight)
        taken = []
        for record in self.engine.ledger.records():
            by_holder: dict[tuple[str, str, str], list[str]] = defaultdict(list)
            for d in record.devices.values():
                namespace, holder = d.metadata.get("namespace"), d.metadata.get("holder")
                if namespace and holder and (namespace, holder) not in in_flight:
                    by_holder[(namespace, holder, d.metadata.get("holderUid", ""))].append(d.key)
            for (namespace, holder, uid), keys in by_holder.items():
                try:
                    pod = self.kube.find_pod(namespace, holder)
                except ApiError as exc:
                    log.warning("cannot read holder pod %s/%s: %s", namespace, holder, exc.message)
                    continue
                if (
                    pod is not None
                    and pod.phase not in ("Failed", "Succeeded")
                    and (not uid or pod.uid == uid)  # not another pod of the same name
                ):
                    continue  # still there (only its labels changed): the books are right
                ref = record.container_id or record.key
                try:
                    with self._lock(ref):
                        now = self.engine.ledger.load(record.key)
                        mine = [
                            k
                            for k in keys
                            if now
                            and k in now.devices
                            and now.devices[k].metadata.get("holder") == holder
                        ]
                        if mine:
                            self.engine.unmount(ref, mine, force=True)
                except HotmountError as exc:
                    log.warning("cannot take back %s from %s: %s", keys, ref, exc.message)
                    continue
                if mine:
                    log.warning(
                        "took %s back from %s: its holder pod %s/%s is gone, so the kubelet "
                        "counts it free",
                        ", ".join(mine),
                        ref,
                        namespace,
                        holder,
                    )
                    taken += mine
        return taken

    def collect_orphan_holders(self) -> list[str]:
        """Delete this node's holder pods that no live mount accounts for.

        A holder is kept while a ledger record (of a container the engine's reconcile
        just found alive) names it, in its namespace; its labels decide nothing here: the
        tenant may edit them, and a holder taken for an orphan frees its GPU in the
        kubelet's books while the container still has it. Others are deleted once
        they have looked orphaned for `holder_orphan_grace` seconds, so that a mount in
        progress in another agent process (a rolling update) is never hit; this
        process's own mounts in progress are skipped outright. Order matters: holders
        are listed first, then the in-flight set is read, then the ledger, so a mount
        that finishes in between is seen in the one or the other.
        """
        node = self.settings.node_name
        if self.kube is None or not node:
            return []
        try:
            listed = [h for h in self.kube.holder_pods(HOLDER_SELECTOR) if h.node == node]
        except ApiError as exc:
            log.warning("cannot list holder pods: %s", exc.message)
            return []
        with self._in_flight_guard:
            in_flight = set(self._holders_in_flight)
        accounted = {
            (d.metadata.get("namespace"), d.metadata.get("holder"))
            for record in self.engine.ledger.records()
            for d in record.devices.values()
            if d.metadata.get("holder")
        }
        now = time.monotonic()
        seen: dict[tuple[str, str], float] = {}
        deleted = []
        for holder in listed:
            key = (holder.namespace, holder.name)
            target = holder.labels.get(HOLDER_LABEL)
            if key in in_flight or key in accounted:
                continue
            first = self._orphans_seen.get(key, now)
            if now - first < self.settings.holder_orphan_grace:
                seen[key] = first
                continue
            try:
                self.kube.delete_pod(holder.namespace, holder.name)
            except ApiError as exc:
                log.warning("cannot delete orphan holder %s/%s: %s", *key, exc.message)
                seen[key] = first
                continue
            log.info(
                "deleted holder pod %s/%s: no live container of pod %s holds its devices",
                holder.namespace,
                holder.name,
                target,
            )
            deleted.append(f"{holder.namespace}/{holder.name}")
        self._orphans_seen = seen
        return deleted

    # -- helpers
    def _kube(self) -> KubeClient:
        if self.kube is None:
            raise BadRequest("this agent runs without Kubernetes (--no-kubernetes)")
        return self.kube

    @contextmanager
    def _lock(self, container_id: str) -> Iterator[None]:
        with self._locks_guard:
            lock = self._locks[container_id]
        with lock:
            yield

    @contextmanager
    def _measure(self, operation: str) -> Iterator[None]:
        started = time.perf_counter()
        try:
            yield
        except (ApiError, HotmountError) as exc:
            code = getattr(exc, "code", None) or getattr(exc, "http_status", 500)
            self.metrics.operations.labels(operation, "conflict" if code == 409 else "error").inc()
            raise
        except Exception:
            self.metrics.operations.labels(operation, "error").inc()
            raise
        else:
            self.metrics.operations.labels(operation, "success").inc()
        finally:
            self.metrics.latency.labels(operation).observe(time.perf_counter() - started)

    def _event(self, pod: PodInfo, reason: str, message: str) -> None:
        if self.kube is not None:
            self.kube.record_event(pod, reason, message)


def _mount_result(
    done: eng.MountResult, pod: PodInfo | None, container: ContainerInfo | None
) -> MountResult:
    def convert(items: list[eng.MountedDevice]) -> list[MountedDevice]:
        return [
            MountedDevice(key=m.key, kind=m.kind, index=m.index, uuid=m.uuid, paths=m.paths)
            for m in items
        ]

    return MountResult(
        namespace=pod.namespace if pod else None,
        pod=pod.name if pod else None,
        container=container.name if container else None,
        container_id=str(done.container.get("id") or ""),
        mounted=convert(done.mounted),
        already_mounted=convert(done.already_mounted),
        netdevs=done.netdevs,
    )


KUBELET = "kubelet:"


@dataclass(frozen=True)
class KubeletHold:
    """One device ID the kubelet gave a pod, and the physical device behind it."""

    allocation: Allocation
    device_id: str
    footprint: Footprint

    def holder(self) -> DeviceHolder:
        a = self.allocation
        return DeviceHolder(
            source="kubelet",
            namespace=a.pod_namespace,
            pod=a.pod_name,
            container=a.container_name,
            device=self.device_id,
        )

    def claim(self) -> Claim:
        a = self.allocation
        return Claim(
            f"{KUBELET}{a.pod_namespace}/{a.pod_name}",
            self.device_id,
            f"{a.pod_namespace}/{a.pod_name}",
            self.footprint,
            holder={"namespace": a.pod_namespace, "pod": a.pod_name, "container": a.container_name},
        )


def _hot_holder(claim: Claim) -> DeviceHolder:
    return DeviceHolder(
        source="hotmount",
        namespace=claim.holder.get("namespace"),
        pod=claim.holder.get("pod"),
        container=claim.holder.get("container"),
        container_id=claim.owner,
        device=claim.device,
        shared_with=_pod_of(claim.shared_with),
    )


def _clock_key(owner: str, entry: DeviceRecord) -> tuple[str, str, str]:
    """One mount: a device unmounted and mounted again starts a new idle clock."""
    return (owner, entry.key, entry.metadata.get(idle.MOUNT_ID_KEY) or entry.mounted_at)


def _pod_of(group: str | None) -> str | None:
    """`namespace/pod` -> `pod`: sharing never leaves a namespace."""
    return group.rpartition("/")[2] if group else None


def _meta(info: PodInfo, container: ContainerInfo, user: str) -> dict[str, str]:
    return {
        "namespace": info.namespace,
        "pod": info.name,
        "container": container.name,
        "user": user,
    }


def _label(device: MountedDevice) -> str:
    return f"GPU {device.index} ({device.key})" if device.index is not None else device.key


def _device_label(device: Device) -> str:
    return f"{device.index} ({device.key})" if device.index is not None else device.key
