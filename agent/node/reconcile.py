"""The periodic pass: the engine's reconcile (drift repairs), its metrics, then the
node's own repairs: orphan holder pods, mounts whose holder is gone, idle GPUs."""

from __future__ import annotations

from dataclasses import dataclass

from agent.metrics import Metrics
from agent.node.holders import HolderPods
from agent.node.idle_reclaim import IdleReclaim
from hotmount import engine as eng
from hotmount.results import ReconcileReport


@dataclass(frozen=True)
class ReconcilePass:
    engine: eng.Engine
    metrics: Metrics
    holders: HolderPods
    idle_reclaim: IdleReclaim

    def reconcile(self) -> ReconcileReport:
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
        deleted = self.holders.collect_orphan_holders()
        if deleted:
            self.metrics.orphan_holders.inc(len(deleted))
        self.holders.take_back_unheld()
        self.idle_reclaim.reclaim_idle()
        return report
