"""Moves: a named GPU from one pod's container to another's (reassign), put back where
it was when the mount at the target fails."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from agent.books.holders import HOLDER_LABEL
from agent.books.pins import pin_of
from agent.common.locks import ContainerLocks
from agent.common.results import device_label, measure, record_event, require_kube
from agent.common.targets import Targets
from agent.errors import ApiError
from agent.kube.client import KubeClient, PodInfo
from agent.metrics import Metrics
from agent.node.mounting import Mounting
from hotmount.api import Device, DeviceRecord, Engine, HotmountError
from hotmount.wire.schemas import MountRequest, ReassignRequest, ReassignResult

log = logging.getLogger(__name__)


class NotMounted(ApiError):
    code, reason = 409, "NotMounted"


class MountedByCount(ApiError):
    """A count-mounted GPU is accounted for by a holder pod that cannot follow it."""

    code, reason = 409, "MountedByCount"


class PinnedInNamespace(ApiError):
    """A pin charges its namespace's quota and is owned by a pod of that namespace: it
    can follow its GPU to another pod there, not into another namespace."""

    code, reason = 409, "PinnedInNamespace"


@dataclass(frozen=True)
class Moves:
    engine: Engine
    kube: KubeClient | None
    metrics: Metrics
    locks: ContainerLocks
    targets: Targets
    mounting: Mounting

    def reassign(
        self,
        request: ReassignRequest,
        user: str,
        found: tuple[PodInfo | None, PodInfo | None] = (None, None),
    ) -> ReassignResult:
        """`found`: the source and target pods as the route's placement looked them up
        (on this node; None: looked up here)."""
        with measure(self.metrics, "reassign"):
            source_pod, source = self.targets.container(
                request.from_.namespace, request.from_.pod, request.from_.container, found[0]
            )
            target_pod, target = self.targets.container(
                request.to.namespace, request.to.pod, request.to.container, found[1]
            )
            device = self.engine.inventory.resolve(request.device)
            assert source.container_id is not None and target.container_id is not None
            record = self.engine.mounts.record(source.container_id)
            if record is None or device.key not in record.devices:
                raise NotMounted(
                    f"device {device_label(device)} is not hot-mounted in "
                    f"{request.from_.namespace}/{request.from_.pod}"
                )
            source_entry = record.devices[device.key]
            source_meta = dict(source_entry.metadata)
            if source_meta.get("holder") and not pin_of(source_meta):
                raise MountedByCount(
                    f"device {device_label(device)} was mounted into "
                    f"{request.from_.namespace}/{request.from_.pod} by count: the kubelet "
                    f"counts it as holder pod {request.from_.namespace}/{source_meta['holder']}'s, "
                    "and a holder cannot follow it (the kubelet cannot be asked for one "
                    "particular GPU). Unmount it there, then mount by count into "
                    f"{request.to.namespace}/{request.to.pod}",
                    {"holderPod": source_meta["holder"]},
                )
            pin = pin_of(source_meta)
            if pin and source_pod.namespace != target_pod.namespace:
                raise PinnedInNamespace(
                    f"device {device_label(device)} is pinned in the scheduler's books by pod "
                    f"{source_pod.namespace}/{pin}, which {source_pod.namespace}'s quota pays "
                    f"for; a pin cannot move to namespace {target_pod.namespace}. Unmount it "
                    f"there, then mount it into {target_pod.namespace}/{target_pod.name}",
                    {"pin": pin},
                )
            shared_pin = pin is not None and self._pin_serves_others(pin, source.container_id)
            if shared_pin:
                raise PinnedInNamespace(
                    f"device {device_label(device)} is also mounted in another container of "
                    f"{source_pod.namespace}/{source_pod.name}, whose pin {pin} must stay; "
                    "unmount it from the others first",
                    {"pin": pin},
                )
            # Between the unmount and the mount (or the rollback) no ledger record names
            # the pin: in flight, reconcile neither releases it nor takes it for an orphan.
            moving = [pin] if pin is not None else []
            with self.mounting.holders.in_flight(source_pod.namespace, moving):
                unmounted = self.mounting.unmount_pod(
                    request.from_.namespace,
                    request.from_.pod,
                    [device.key],
                    container=source.name,
                    force=request.force,
                    user=user,
                    keep_holders=pin is not None,
                    found=source_pod,
                )
                try:
                    if pin is not None:  # the pin follows: the GPU never looks free
                        uid = source_meta.get("holderUid", "")
                        self._hand_over(pin, uid, source_pod, target_pod)
                    mounted = self.mounting.mount_pod(
                        request.to.namespace,
                        request.to.pod,
                        MountRequest(
                            container=target.name, devices=[device.key], force=request.force
                        ),
                        user,
                        target_pod,
                    )
                except Exception as exc:
                    if pin is not None:
                        self._hand_back(pin, source_pod)
                    self._roll_back(source.container_id, device, source_entry, request.force, exc)
                    raise
            for pod in (source_pod, target_pod):
                record_event(
                    self.kube,
                    pod,
                    "GPUReassigned",
                    f"{device_label(device)} moved from "
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

    def _pin_serves_others(self, pin: str, container_id: str) -> bool:
        return any(
            d.metadata.get("holder") == pin
            for record in self.engine.mounts.records()
            if container_id not in (record.key, record.container_id)
            for d in record.devices.values()
        )

    def _hand_over(self, pin: str, uid: str, source: PodInfo, target: PodInfo) -> None:
        """The pin stands for the target pod from now on (labels and owner, one patch)."""
        kube = require_kube(self.kube)
        found = kube.find_pod(source.namespace, pin)
        if found is None or (uid and found.uid != uid):
            raise NotMounted(f"the pin {source.namespace}/{pin} of this GPU is gone")
        kube.hand_over(source.namespace, pin, {**found.labels, HOLDER_LABEL: target.name}, target)

    def _hand_back(self, pin: str, source: PodInfo) -> None:
        kube = require_kube(self.kube)
        try:
            found = kube.find_pod(source.namespace, pin)
            if found is not None:
                labels = {**found.labels, HOLDER_LABEL: source.name}
                kube.hand_over(source.namespace, pin, labels, source)
        except ApiError as exc:
            log.error("could not give pin %s back to %s: %s", pin, source.name, exc.message)

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
            with self.locks.hold(container_id):
                self.engine.mount(
                    container_id,
                    [device.key],
                    force=force,
                    metadata=dict(entry.metadata),
                    workload=entry.workload,
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
