"""Prometheus metrics, one registry per app so tests can build many apps."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.operations = Counter(
            "hotmount_operations_total",
            "Mounts, unmounts and reassigns by result",
            ["operation", "result"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "hotmount_operation_seconds",
            "Latency of mounts, unmounts and reassigns",
            ["operation"],
            registry=self.registry,
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10),
        )
        self.managed_containers = Gauge(
            "hotmount_managed_containers",
            "Containers with hot-mounted devices",
            registry=self.registry,
        )
        self.drift_repairs = Counter(
            "hotmount_drift_repairs_total",
            "Grants, wrappers and nodes restored by reconcile",
            ["kind"],
            registry=self.registry,
        )
        self.orphan_holders = Counter(
            "hotmount_orphan_holders_deleted_total",
            "Holder pods reconcile deleted because no live mount accounted for them",
            registry=self.registry,
        )
        self.reconciles = Counter(
            "hotmount_reconciles_total",
            "Reconcile passes by result",
            ["result"],
            registry=self.registry,
        )
