"""Prometheus metrics, one registry per app so tests can build many apps.

The per-mount gauges (`hotmount_gpu_mounted_info`, `hotmount_gpu_idle_seconds`) are
read from the ledger at scrape time by a collector, not set and unset as mounts come
and go: an unmount, a reclaim, a container that died or an agent restart can then
never leave a label set behind, and nothing needs to be kept in step.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

MOUNT_LABELS = ("node", "gpu_uuid", "device", "namespace", "pod", "container")
UTILIZATION_LABELS = ("node", "gpu_uuid", "namespace", "pod")


@dataclass(frozen=True)
class MountSample:
    """One hot-mounted device, labelled so Grafana can join it with DCGM's metrics:
    `gpu_uuid` is DCGM's `UUID`, `device` its `device` (`nvidia0`)."""

    gpu_uuid: str
    device: str
    namespace: str
    pod: str
    container: str
    idle_seconds: float | None  # None: the reconciler has not looked yet
    # Issue 20: from the reconciler's NVML samples (`unused` mounts), and once warned.
    utilization: float | None = None  # 0..1; None: not sampled
    reclaim_in: float | None = None  # seconds until the reclaim; None: not warned


class _MountCollector(Collector):
    def __init__(self, node: str, source: Callable[[], list[MountSample]]) -> None:
        self.node, self.source = node, source

    def describe(self) -> Iterator[GaugeMetricFamily]:
        """The names alone: registering must not read the ledger."""
        yield from self._families()

    def _families(self) -> tuple[GaugeMetricFamily, GaugeMetricFamily]:
        info = GaugeMetricFamily(
            "hotmount_gpu_mounted_info",
            "1 for every hot-mounted GPU: which pod and container has it",
            labels=MOUNT_LABELS,
        )
        idle = GaugeMetricFamily(
            "hotmount_gpu_idle_seconds",
            "Seconds no process in the container has held the hot-mounted GPU open",
            labels=MOUNT_LABELS,
        )
        return info, idle

    def collect(self) -> Iterator[GaugeMetricFamily]:
        info, idle = self._families()
        samples = self.source()
        for sample in samples:
            labels = [
                self.node,
                sample.gpu_uuid,
                sample.device,
                sample.namespace,
                sample.pod,
                sample.container,
            ]
            info.add_metric(labels, 1)
            if sample.idle_seconds is not None:
                idle.add_metric(labels, sample.idle_seconds)
        yield info
        yield idle
        yield from self._activity_families(samples)

    def _activity_families(self, samples: list[MountSample]) -> Iterator[GaugeMetricFamily]:
        """Issue 20: per-pod GPU use from the reconciler's samples (one series per pod and
        GPU, the highest when several of its containers share one), and the warned mounts."""
        utilization = GaugeMetricFamily(
            "hotmount_gpu_utilization_ratio",
            "GPU utilization (0..1) of the pod's processes on the hot-mounted GPU, from the "
            "NVML samples the idle policy `unused` reads",
            labels=UTILIZATION_LABELS,
        )
        warned = GaugeMetricFamily(
            "hotmount_gpu_reclaim_in_seconds",
            "Seconds until an idle hot-mounted GPU is reclaimed, once warned (GPUIdleSoon)",
            labels=MOUNT_LABELS,
        )
        per_pod: dict[tuple[str, ...], float] = {}
        for sample in samples:
            if sample.utilization is not None:
                key = (self.node, sample.gpu_uuid, sample.namespace, sample.pod)
                per_pod[key] = max(per_pod.get(key, 0.0), sample.utilization)
            if sample.reclaim_in is not None:
                labels = [self.node, sample.gpu_uuid, sample.device]
                warned.add_metric(
                    [*labels, sample.namespace, sample.pod, sample.container], sample.reclaim_in
                )
        for pod_key, value in per_pod.items():
            utilization.add_metric(list(pod_key), value)
        yield utilization
        yield warned


class _GpuStateCollector(Collector):
    """Issue 34: the node's GPUs by state (agent/books/gpu_states.py), read at scrape time."""

    def __init__(self, node: str, source: Callable[[], dict[str, int]]) -> None:
        self.node, self.source = node, source

    def describe(self) -> Iterator[GaugeMetricFamily]:
        yield self._family()

    def _family(self) -> GaugeMetricFamily:
        return GaugeMetricFamily(
            "hotmount_node_gpus",
            "The node's GPUs by state: free, allocated (the kubelet gave it to a pod), "
            "hot_mounted, pinned (hot-mounted and kept in the scheduler's books by a pin)",
            labels=("node", "state"),
        )

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = self._family()
        for state, count in self.source().items():
            family.add_metric([self.node, state], count)
        yield family


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        # `forwarded`: sent on to the pod's node's agent, which counts its real result; a
        # call is counted once per agent, never as an error where it was only passed on.
        self.operations = Counter(
            "hotmount_operations_total",
            "Mounts, unmounts, suspends, resumes and reassigns by result (success, conflict, "
            "error, forwarded: done by the agent of the pod's node)",
            ["operation", "result"],
            registry=self.registry,
        )
        # Issue 34: why calls were refused (the error's reason: QuotaExceeded, Conflict...),
        # so an alert can tell a namespace out of quota from the agent failing.
        self.refused = Counter(
            "hotmount_operations_refused_total",
            "Mounts, unmounts and reassigns refused, by the reason the caller was given",
            ["operation", "reason"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "hotmount_operation_seconds",
            "Latency of mounts, unmounts and reassigns",
            ["operation"],
            registry=self.registry,
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10),
        )
        self.suspended_gpus = Gauge(
            "hotmount_suspended_gpus",
            "GPUs taken from pods by a suspension, their processes kept for a resume",
            registry=self.registry,
        )
        self.requests_in_agent = Gauge(
            "hotmount_requests_in_agent",
            "API calls in the agent now, waiting in line or at work (see --max-requests)",
            registry=self.registry,
        )
        self.mutating_waiting = Gauge(
            "hotmount_mutating_waiting",
            "Mounts, unmounts and moves waiting in line for a slot (see --max-mutating)",
            registry=self.registry,
        )
        self.token_reviews = Gauge(
            "hotmount_token_reviews",
            "Calls whose new token is being checked with a TokenReview now (see "
            "--max-token-reviews), and calls waiting for the same token's review",
            ["state"],
            registry=self.registry,
        )
        # Issue 34: the bound itself, so an alert compares with what this agent runs with.
        self.token_reviews_limit = Gauge(
            "hotmount_token_reviews_limit",
            "TokenReviews this agent runs at most at once (--max-token-reviews)",
            registry=self.registry,
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
        self.reclaimed = Counter(
            "hotmount_gpus_reclaimed_total",
            "Hot-mounted GPUs reconcile took back after their idle timeout",
            registry=self.registry,
        )
        self.double_booked = Gauge(
            "hotmount_gpu_double_booked",
            "1 for each hot-mounted GPU the kubelet also gave another pod, as the last "
            "reconcile found it (docs/api.md, Accounting)",
            ["gpu", "namespace", "pod", "other_namespace", "other_pod"],
            registry=self.registry,
        )
        self.double_bookings_taken_back = Counter(
            "hotmount_gpu_double_bookings_taken_back_total",
            "Double-booked hot-mounts reconcile took back (--on-double-booking=take-back)",
            registry=self.registry,
        )
        self.reclaim_failures = Counter(
            "hotmount_gpu_reclaim_failures_total",
            "Idle hot-mounted GPUs reconcile meant to take back and did not: `error` (the "
            "unmount failed), `skipped` (a process also using a GPU that stays holds it), "
            "`refused` (policy suspend: the suspension was refused, nothing was stopped)",
            ["reason"],
            registry=self.registry,
        )
        self.idle_warnings = Counter(
            "hotmount_gpu_idle_warnings_total",
            "GPUIdleSoon warnings: hot-mounted GPUs about to be reclaimed unless used",
            registry=self.registry,
        )
        self.reconciles = Counter(
            "hotmount_reconciles_total",
            "Reconcile passes by result",
            ["result"],
            registry=self.registry,
        )
        self.reconcile_last_success = Gauge(
            "hotmount_reconcile_last_success_timestamp_seconds",
            "Unix time the last reconcile pass finished without raising (0: none yet)",
            registry=self.registry,
        )

        self.on_demand = OnDemandMetrics(self.registry)

    def watch_mounts(self, node: str, source: Callable[[], list[MountSample]]) -> None:
        """Serve the per-mount gauges from `source`, called at every scrape."""
        self.registry.register(_MountCollector(node, source))

    def watch_gpu_states(self, node: str, source: Callable[[], dict[str, int]]) -> None:
        """Serve `hotmount_node_gpus` from `source`, called at every scrape."""
        self.registry.register(_GpuStateCollector(node, source))


class OnDemandMetrics:
    """Issue 42: the node's on-demand GPUs (agent/ondemand/). `gpu_seconds` against
    `dedicated_seconds` is what on demand saves: the GPU-seconds attached, and those the
    same pods would have held with their GPUs for all the time the agent knew them."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.queue_length = Gauge(
            "hotmount_ondemand_queue_length",
            "On-demand requests waiting for a free GPU on this node",
            registry=registry,
        )
        self.wait = Histogram(
            "hotmount_ondemand_wait_seconds",
            "How long an on-demand cell waited for its GPU (0 when one was attached or free)",
            registry=registry,
            buckets=(0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600),
        )
        self.attaches = Counter(
            "hotmount_ondemand_attaches_total",
            "On-demand GPUs attached: `first` (a pod's first cell), `resume` (a suspended "
            "pod's next cell, onto any free GPU of its model)",
            ["how"],
            registry=registry,
        )
        self.suspends = Counter(
            "hotmount_ondemand_suspends_total",
            "On-demand GPUs suspended: `idle` (no cell for the pod's idle time), `waiter` "
            "(idle past the minimum hold, for a pod in the queue)",
            ["why"],
            registry=registry,
        )
        self.refused = Counter(
            "hotmount_ondemand_refused_total",
            "On-demand requests refused or given up, by reason (QuotaExceeded, "
            "TooManyRequests, Abandoned: the caller stopped asking)",
            ["reason"],
            registry=registry,
        )
        self.gpu_seconds = Counter(
            "hotmount_ondemand_gpu_seconds_total",
            "GPU-seconds on-demand pods held a GPU attached",
            registry=registry,
        )
        self.dedicated_seconds = Counter(
            "hotmount_ondemand_dedicated_gpu_seconds_total",
            "GPU-seconds the same pods would have held with dedicated GPUs (each pod's count "
            "times its time known to the agent)",
            registry=registry,
        )
