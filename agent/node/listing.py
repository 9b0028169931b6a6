"""What is mounted where, for reading: the node's devices and everyone holding each, a
pod's or a namespace's or a container's mounts, and the per-mount metrics samples."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from agent.books.accounting import Accounting
from agent.books.kubelet import KubeletBooks, KubeletHold
from agent.books.pins import pin_of
from agent.common.results import POD_UID, require_kube
from agent.common.targets import Targets
from agent.config import AgentSettings
from agent.errors import PodNotFound
from agent.idle import policy as idle
from agent.idle.reclaim import IdleReclaim
from agent.kube.client import KubeClient
from agent.metrics import MountSample
from hotmount.api import Claim, DeviceKind, DeviceRecord, Engine, SuspendedGpu
from hotmount.wire.durations import format_duration
from hotmount.wire.results import hot_holder, pod_of
from hotmount.wire.schemas import (
    ContainerDevices,
    DeviceHolder,
    DeviceInfo,
    DeviceList,
    MountedDevice,
    PodDevices,
    QueuedRequest,
)

# The kinds a scheduler's books can hold (an RDMA NIC is outside "Accounting" for now).
BOOKED_KINDS = (DeviceKind.GPU, DeviceKind.MIG, DeviceKind.CDI)


@dataclass(frozen=True)
class Listing:
    settings: AgentSettings
    engine: Engine
    kube: KubeClient | None
    targets: Targets
    kubelet: KubeletBooks
    accounting: Accounting
    idle_reclaim: IdleReclaim
    queued: Callable[[], list[QueuedRequest]] = list  # the on-demand queue (agent/ondemand/)

    @property
    def node_name(self) -> str | None:
        return self.settings.node_name

    def devices(self, recent_books: bool = False) -> DeviceList:
        """One entry per physical device, with everyone who holds it under any name, and
        whose books it is in. A pin shows on the hot-mount it keeps, not again as the
        kubelet's holder. `recent_books`: the books of the last seconds will do (another
        agent's list asks; then no call reaches the API server)."""
        hot = self.engine.holders()
        kubelet = self.kubelet.holds()
        pins = self._pins()
        accounting = self.accounting
        books = accounting.recent_books() if recent_books else accounting.books(strict=False)
        inventory = self.engine.inventory
        near = {nic: [g.key for g in gpus] for nic, gpus in inventory.nearest_gpus().items()}
        nearest_rdma = {gpu: nic for nic, gpus in near.items() for gpu in gpus}
        idle_seconds = self._idle_seconds()
        infos = []
        for device in inventory.devices:
            mine = inventory.footprint(device)
            holders = [
                hot_holder(c, pins.get((c.owner, c.device))) for c in hot.get(device.key, [])
            ]
            shown = {(h.namespace, h.pin) for h in holders if h.pin}
            holders += [
                h.holder()
                for h in kubelet
                if h.footprint.overlaps(mine)
                and (h.allocation.pod_namespace, h.allocation.pod_name) not in shown
            ]
            nic = nearest_rdma.get(device.key) or nearest_rdma.get(device.parent or "")
            management = (
                str(self.accounting.case(device, books)) if device.kind in BOOKED_KINDS else None
            )
            info = DeviceInfo.of(device, holders, near.get(device.key), nic, management)
            info.idle_seconds = idle_seconds.get(device.key)
            infos.append(info)
        return DeviceList(node=self.settings.node_name, devices=infos, queue=self.queued())

    def _idle_seconds(self) -> dict[str, int]:
        """Each hot-mounted device's idle time (the least, when several containers share it)."""
        now = time.time()
        found: dict[str, int] = {}
        for record in self.engine.mounts.records():
            for entry in record.devices.values():
                seconds = self.idle_reclaim.idle_for(record.key, entry, now)
                if seconds is not None and self.idle_reclaim.is_gpu(entry):
                    found[entry.key] = min(int(seconds), found.get(entry.key, int(seconds)))
        return found

    def _pin_pods(self) -> set[tuple[str, str]]:
        """(namespace, name) of every pin a mount names: shown on its hot-mount, and not
        again as a holder of the kubelet's."""
        return {
            (entry.metadata.get("namespace", ""), pin)
            for record in self.engine.mounts.records()
            for entry in record.devices.values()
            if (pin := pin_of(entry.metadata))
        }

    def _pins(self) -> dict[tuple[str, str], str]:
        """(container key, device key) to the pin its ledger entry names."""
        return {
            (record.key, entry.key): pin
            for record in self.engine.mounts.records()
            for entry in record.devices.values()
            if (pin := pin_of(entry.metadata))
        }

    def pod_devices_here(self, namespace: str, pod: str, located: bool = False) -> PodDevices:
        """A pod's mounts, once the pod is known to live on this node: `located` by the
        route's placement, or checked here (NotOnThisNode otherwise)."""
        if not located:
            self.targets.node_check(namespace, pod)
        return self.pod_devices(namespace, pod)

    def pod_devices(self, namespace: str, pod: str) -> PodDevices:
        info = require_kube(self.kube).get_pod(namespace, pod)  # 404 for an unknown pod
        containers = []
        hot: dict[str, list[Claim]] | None = None
        kubelet: list[KubeletHold] | None = None
        for record in self.engine.mounts.records():
            # By UID too: a pod deleted and made again under its name is another pod, and
            # its predecessor's records stay until the next reconcile drops them.
            def ours(d: DeviceRecord) -> bool:
                return (
                    d.metadata.get("namespace") == namespace
                    and d.metadata.get("pod") == pod
                    and d.metadata.get(POD_UID, info.uid) == info.uid
                )

            devices = [d for d in record.devices.values() if ours(d)]
            suspended = [s for s in record.suspended.values() if ours(s.device)]
            if devices or suspended:
                hot = hot if hot is not None else self.engine.holders()
                kubelet = kubelet if kubelet is not None else self.kubelet.holds()
                containers.append(
                    ContainerDevices(
                        container=(devices[0] if devices else suspended[0].device).metadata.get(
                            "container"
                        ),
                        container_id=record.container_id or record.key,
                        devices=[
                            *(
                                self._mounted_from_record(d, record.key, hot, kubelet)
                                for d in devices
                            ),
                            *(self._suspended_device(s) for s in suspended),
                        ],
                    )
                )
        places = {(q.namespace, q.pod): q.position for q in self.queued()}
        place = places.get((namespace, pod))
        return PodDevices(
            namespace=namespace,
            pod=pod,
            node=self.settings.node_name,
            pod_uid=info.uid,
            containers=containers,
            queued=place,
        )

    def _suspended_device(self, entry: SuspendedGpu) -> MountedDevice:
        device = self.engine.inventory.get(entry.device.key)
        return suspended_device(entry, device.index if device else None)

    def mounted_namespaces(self) -> list[str]:
        """The namespaces of this node's mounts, from the ledger alone (no API call)."""
        return sorted({namespace for namespace, _ in self._pods_in_ledger()})

    def _pods_in_ledger(self) -> set[tuple[str, str]]:
        """(namespace, pod) of every mount in the ledger, a suspended one too: a pod whose
        GPUs are all suspended has no device mounted, and is still listed (as suspended);
        and every pod in the on-demand queue."""
        waiting = {(q.namespace, q.pod) for q in self.queued()}  # on demand, none held yet
        return waiting | {
            (meta["namespace"], meta["pod"])
            for r in self.engine.mounts.records()
            for meta in (
                *(d.metadata for d in r.devices.values()),
                *(s.device.metadata for s in r.suspended.values()),
            )
            if meta.get("pod") and meta.get("namespace")
        }

    def namespace_mounts(self, namespace: str) -> list[PodDevices]:
        return self.all_mounts(namespace).get(namespace, [])

    def all_mounts(self, namespace: str | None = None) -> dict[str, list[PodDevices]]:
        """Namespace to the mounts of each of its pods on this node (one namespace's when
        `namespace` is given); pods that are gone already are left out."""
        pods = sorted(p for p in self._pods_in_ledger() if namespace in (None, p[0]))
        out: dict[str, list[PodDevices]] = {}
        for pod_namespace, pod in pods:
            try:
                out.setdefault(pod_namespace, []).append(self.pod_devices(pod_namespace, pod))
            except PodNotFound:
                continue
        return out

    def container_devices(self, container_id: str) -> PodDevices:
        container = self.engine.resolve(container_id)
        record = self.engine.mounts.record(container.key)
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
            others += [hot_holder(c) for c in claims_now if c.owner != owner]
            pins = self._pin_pods()
            others += [
                h.holder()
                for h in kubelet or []
                if h.footprint.overlaps(mine)
                and (h.allocation.pod_namespace, h.allocation.pod_name) not in pins
            ]
        timeout = idle.timeout_of(entry.metadata)
        now = time.time()
        idle_for = self.idle_reclaim.idle_for(owner, entry, now)
        reclaim_in = self.idle_reclaim.reclaim_in(owner, entry, now)
        return MountedDevice(
            key=entry.key,
            kind=entry.kind,
            index=device.index if device else None,
            uuid=device.uuid if device else None,
            paths=own,
            shared_with=pod_of(entry.shared_with),
            other_holders=others,
            idle_timeout=format_duration(timeout) if timeout is not None else None,
            idle_seconds=int(idle_for) if idle_for is not None else None,
            idle_policy=idle.policy_of(entry.metadata),
            reclaim_in_seconds=int(reclaim_in) if reclaim_in is not None else None,
            idle_policy_note=self.idle_reclaim.policy_note(owner, entry),
            pin=pin_of(entry.metadata),
            holder=None if pin_of(entry.metadata) else entry.metadata.get("holder"),
            mounted_at=entry.mounted_at,
        )

    def mount_samples(self) -> list[MountSample]:
        """Every hot-mounted GPU, for the per-mount gauges (read at scrape time)."""
        now = time.time()
        samples = []
        for record in self.engine.mounts.records():
            for entry in record.devices.values():
                if not self.idle_reclaim.is_gpu(entry):
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
                        idle_seconds=self.idle_reclaim.idle_for(record.key, entry, now),
                        utilization=self.idle_reclaim.utilization(record.key, entry),
                        reclaim_in=self.idle_reclaim.reclaim_in(record.key, entry, now),
                    )
                )
        return samples


def suspended_device(entry: SuspendedGpu, index: int | None = None) -> MountedDevice:
    """A GPU a suspension took (hotmount/suspend/): no paths, no holder pod; its index
    (the inventory's) as a mounted one has, for `kubectl get gpumounts` to show it so."""
    return MountedDevice(
        key=entry.device.key,
        kind=entry.device.kind,
        index=index,
        uuid=entry.uuid or None,
        paths=[],
        mounted_at=entry.device.mounted_at,
        state="suspended",
    )
