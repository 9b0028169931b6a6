"""The periodic pass: the engine's reconcile (drift repairs), its metrics, then the
node's own repairs: devices of restarted containers mounted again, holder pods of
containers that died, orphan holder pods, mounts whose holder is gone, double-booked
GPUs, idle GPUs.

The pass never waits on a container's lock: one that another call holds (a suspension
runs for minutes) is skipped and looked at again in the next pass
(agent/common/locks.py). Work that takes minutes on one container, an idle suspension
or the repair of a suspension a crash left part-way, is started beside it
(agent/common/background.py), so the pass, and /healthz with it, keeps its pace."""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass

from agent.books.double_booking import DoubleBookings
from agent.books.holders import HolderPods
from agent.common.background import Background
from agent.common.locks import ContainerLocks
from agent.errors import ApiError, PodNotFound
from agent.idle.reclaim import IdleReclaim
from agent.kube.client import KubeClient
from agent.metrics import Metrics
from agent.node.desired import DesiredMounts
from agent.node.remounts import Remounts
from hotmount.api import ContainerRecord, Engine, ReconcileReport

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ReconcilePass:
    engine: Engine
    metrics: Metrics
    holders: HolderPods
    double_bookings: DoubleBookings
    idle_reclaim: IdleReclaim
    remounts: Remounts
    desired: DesiredMounts
    kube: KubeClient | None
    locks: ContainerLocks
    background: Background

    def reconcile(self) -> ReconcileReport:
        records = {r.key: r for r in self.engine.mounts.records()}
        before = self._named_holders()
        report = self.engine.reconcile(suspensions=False)
        self._repair_suspensions()  # after the pending ops: a suspension's unmount
        # What a dead container had is kept for its successor before its holders are
        # swept, and mounted again once that one runs (restarts keep their GPUs).
        self.remounts.keep(records[k] for k in report.forgotten if k in records)
        self.remounts.remount()
        self._release_swept(before)
        self._prune_desired()
        repairs = {
            "grant": report.regranted,
            "wrapper": report.rewrapped,
            "node": report.recreated,
            "pending": report.pending_finished,
        }
        for kind, count in repairs.items():
            if count:
                self.metrics.drift_repairs.labels(kind).inc(count)
        self.metrics.managed_containers.set(len(self.engine.mounts.records()))
        self.metrics.reconciles.labels("error" if report.errors else "ok").inc()
        deleted = self.holders.collect_orphan_holders()
        if deleted:
            self.metrics.orphan_holders.inc(len(deleted))
        # Before the holders: a mount whose pin is gone and whose GPU the kubelet gave
        # another pod is a double booking, and says so, before it is taken back as unheld.
        self.double_bookings.check()
        self.holders.take_back_unheld()
        self.idle_reclaim.reclaim_idle()
        return report

    def _repair_suspensions(self) -> None:
        """Start the repair of each suspension a crash left part-way, beside the pass:
        its restores may take minutes. One whose container is busy (the suspend or
        resume that runs holds its lock) or whose repair still runs waits for a later
        pass."""
        for record in self.engine.suspender.unfinished():
            self.background.start(
                record.key,
                f"repair of {record.key}'s suspension",
                functools.partial(self._repair, record),
            )

    def _repair(self, record: ContainerRecord) -> None:
        ref = record.container_id or record.key
        with self.locks.try_hold(ref) as free:
            if not free:
                log.debug("suspension of %s: the container is busy; the next pass", ref)
                return
            if self.engine.suspender.repair(record):
                log.info("finished or rolled back the suspension %s left part-way", ref)

    def _prune_desired(self) -> None:
        """A pod's applied spec goes with the pod (or when a namesake replaces it)."""
        if self.kube is None:
            return
        for desired in self.desired.all():
            try:
                uid = self.kube.get_pod(desired.namespace, desired.pod).uid
            except PodNotFound:
                uid = None
            except ApiError as exc:
                log.warning("cannot look up %s/%s: %s", desired.namespace, desired.pod, exc.message)
                continue
            if uid != desired.uid:
                self.desired.delete(desired.namespace, desired.pod)
                log.info(
                    "dropped the GPUMount spec of %s/%s: the pod is gone",
                    desired.namespace,
                    desired.pod,
                )

    def _named_holders(self) -> dict[str, set[str]]:
        """Each namespace's holder and pin pods that a mount, or a restarted container's
        intent, names."""
        named: dict[str, set[str]] = {}
        for record in self.engine.mounts.records():
            for d in record.devices.values():
                namespace, holder = d.metadata.get("namespace"), d.metadata.get("holder")
                if namespace and holder:
                    named.setdefault(namespace, set()).add(holder)
        for namespace, holder in self.holders.intents.named_holders():
            named.setdefault(namespace, set()).add(holder)
        return named

    def _release_swept(self, before: dict[str, set[str]]) -> None:
        """Delete at once the holders and pins of containers this reconcile found dead
        and of intents dropped with their pods: the kubelet then frees their GPUs now,
        not after the orphan grace."""
        for namespace, holders in before.items():
            try:
                released = self.holders.release(namespace, holders, wait=False)
                if released:
                    self.metrics.orphan_holders.inc(len(released))
                    log.info(
                        "deleted holder pods %s in %s: nothing names them", released, namespace
                    )
            except ApiError as exc:
                log.warning("cannot release holder pods in %s: %s", namespace, exc.message)
