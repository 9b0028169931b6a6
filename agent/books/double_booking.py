"""Double booking: a hot-mounted GPU that the kubelet has also given to another pod.

Pins keep the books right, but the books can still go wrong: the tenant deleted the
pin, the agent was down while a pod started, or a mount was forced. Then two pods
use one GPU and neither knows. Reconcile finds it here, and it is never silent: a
Warning Event `GPUDoubleBooked` on both pods, the `hotmount_gpu_double_booked` gauge,
and by default the hot-mount is taken back (forced, after `--stop-grace`), because
the scheduler promised the GPU to the other pod. `--on-double-booking=warn` leaves
it in place.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field

from agent.books.holders import HOLDER_LABEL, HolderPods
from agent.books.kubelet import KubeletBooks, KubeletHold
from agent.common.locks import ContainerLocks
from agent.common.results import unclassified_text
from agent.config import AgentSettings
from agent.errors import ApiError
from agent.kube.client import KubeClient, PodInfo
from agent.metrics import Metrics
from hotmount.api import ContainerRecord, DeviceRecord, Engine, HotmountError

log = logging.getLogger(__name__)

EVENT_REASON = "GPUDoubleBooked"


@dataclass(frozen=True)
class DoubleBooking:
    record: ContainerRecord
    entry: DeviceRecord
    mounted_in: PodInfo
    given_to: PodInfo
    hold: KubeletHold

    @property
    def label(self) -> str:
        device = self.entry.key
        return f"{device} (as {self.hold.device_id})" if self.hold.device_id != device else device

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.record.key, self.entry.key, self.given_to.uid)


@dataclass(frozen=True)
class DoubleBookings:
    settings: AgentSettings
    engine: Engine
    kube: KubeClient | None
    metrics: Metrics
    locks: ContainerLocks
    kubelet: KubeletBooks
    holders: HolderPods
    # What was reported already: one Event per double booking, not one per pass.
    _reported: set[tuple[str, str, str]] = field(default_factory=set, init=False, repr=False)
    _guard: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    def check(self) -> list[DoubleBooking]:
        """Find, report and (by default) resolve every double booking on this node."""
        found = self.find()
        self.metrics.double_booked.clear()
        for booking in found:
            self.metrics.double_booked.labels(
                booking.entry.key,
                booking.mounted_in.namespace,
                booking.mounted_in.name,
                booking.given_to.namespace,
                booking.given_to.name,
            ).set(1)
        with self._guard:
            new = [b for b in found if b.key not in self._reported]
            self._reported.intersection_update({b.key for b in found})
            self._reported.update(b.key for b in new)
        take_back = self.settings.on_double_booking == "take-back"
        for booking in new:
            self._report(booking, take_back)
        if take_back:
            for booking in found:
                self._take_back(booking)
        return found

    def find(self) -> list[DoubleBooking]:
        """Hot-mounts whose physical GPU the kubelet gave a running or starting pod that
        is neither the mount's own pod, the pod it shares with on purpose, nor a holder
        or pin of the mount's pod. A kubelet that cannot answer finds nothing."""
        if self.kube is None:
            return []
        holds = self.kubelet.holds()
        if not holds:
            return []
        inventory = self.engine.inventory
        # A shared RDMA resource's pods all hold its HCAs: one of them is no double booking.
        sharing = {(h.allocation.resource_name, h.pod) for h in holds if h.shared}
        pods: dict[tuple[str, str], PodInfo | None] = {}
        found = []
        for record in self.engine.mounts.records():
            for entry in record.devices.values():
                meta = entry.metadata
                namespace, pod = meta.get("namespace"), meta.get("pod")
                device = inventory.get(entry.key)
                if not namespace or not pod or device is None:
                    continue
                footprint = inventory.footprint(device)
                ours = {f"{namespace}/{pod}", entry.shared_with or ""}
                for hold in holds:
                    owner = (hold.allocation.pod_namespace, hold.allocation.pod_name)
                    if "/".join(owner) in ours or not hold.footprint.overlaps(footprint):
                        continue
                    if hold.shared and any(
                        (hold.allocation.resource_name, p) in sharing for p in ours
                    ):
                        continue
                    if owner == (namespace, meta.get("holder")):
                        continue  # its own pin or count holder
                    other = self._pod(pods, owner)
                    mounted_in = self._pod(pods, (namespace, pod))
                    if other is None or mounted_in is None:
                        continue
                    if other.phase not in ("Running", "Pending"):
                        continue
                    if other.namespace == namespace and other.labels.get(HOLDER_LABEL) == pod:
                        continue  # a holder of the same pod (another container's pin)
                    found.append(DoubleBooking(record, entry, mounted_in, other, hold))
        return found

    def _pod(
        self, cache: dict[tuple[str, str], PodInfo | None], key: tuple[str, str]
    ) -> PodInfo | None:
        if key not in cache:
            try:
                cache[key] = self.kube.find_pod(*key) if self.kube else None
            except ApiError as exc:
                log.warning("double booking: cannot read pod %s/%s: %s", *key, exc.message)
                cache[key] = None
        return cache[key]

    def _report(self, booking: DoubleBooking, take_back: bool) -> None:
        mounted, other = booking.mounted_in, booking.given_to
        what = (
            "it is taken back from the hot-mount (--on-double-booking=take-back)"
            if take_back
            else "both keep it (--on-double-booking=warn)"
        )
        log.warning(
            "GPU %s hot-mounted into %s/%s (%s) is also the kubelet's for pod %s/%s: %s",
            booking.label,
            mounted.namespace,
            mounted.name,
            booking.entry.metadata.get("container", "?"),
            other.namespace,
            other.name,
            what,
        )
        assert self.kube is not None
        self.kube.record_event(
            mounted,
            EVENT_REASON,
            f"GPU {booking.label} hot-mounted here was also given by the kubelet to pod "
            f"{other.namespace}/{other.name}: {what}",
            warning=True,
        )
        self.kube.record_event(
            other,
            EVENT_REASON,
            f"GPU {booking.label} the kubelet gave this pod is also hot-mounted into "
            f"{mounted.namespace}/{mounted.name}: {what}",
            warning=True,
        )

    def _take_back(self, booking: DoubleBooking) -> None:
        record, entry = booking.record, booking.entry
        ref = record.container_id or record.key
        namespace = booking.mounted_in.namespace
        try:
            with self.locks.try_hold(ref) as free:
                if not free:  # a suspension (or another call) runs: the next pass
                    log.debug("double-booked %s in %s: the container is busy", entry.key, ref)
                    return
                now = self.engine.mounts.record(record.key)
                current = now.devices.get(entry.key) if now else None
                if current is None or current.mounted_at != entry.mounted_at:
                    return  # unmounted (or mounted anew) meanwhile
                before = {h for h in [current.metadata.get("holder")] if h}
                # Forced: never waits on a complete look at the open files.
                result = self.engine.unmount(ref, [entry.key], force=True, spare_staying=False)
        except HotmountError as exc:
            log.warning("cannot take double-booked %s back from %s: %s", entry.key, ref, exc)
            return
        # Outside the lock, and not waiting for the pods to go: a pod the tenant keeps
        # terminating (a finalizer) must hold neither the container nor the pass.
        self.holders.release_after(namespace, before, "double booking", wait=False)
        self.metrics.double_bookings_taken_back.inc()
        more = unclassified_text(result)
        log.warning("took double-booked %s back from %s%s", entry.key, ref, more)
        if more and self.kube is not None:
            self.kube.record_event(
                booking.mounted_in,
                EVENT_REASON,
                f"took GPU {booking.label} back{more}",
                warning=True,
            )
