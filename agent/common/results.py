"""What every use case of the node shares: engine results as API schemas (by
hotmount/wire/results.py, as `nvcli --local` maps them), the labels
messages use, and the small acts around an operation (its metrics, an Event, the
Kubernetes client or a 400)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

from agent.errors import ApiError, BadRequest
from agent.kube.client import ContainerInfo, KubeClient, PodInfo
from agent.metrics import Metrics
from hotmount.api import Device, HotmountError, Workload
from hotmount.api import MountResult as EngineMountResult
from hotmount.api import UnmountResult as EngineUnmountResult
from hotmount.wire import results as wire_results
from hotmount.wire.schemas import MountedDevice, MountResult


def require_kube(kube: KubeClient | None) -> KubeClient:
    if kube is None:
        raise BadRequest("this agent runs without Kubernetes (--no-kubernetes)")
    return kube


def record_event(
    kube: KubeClient | None, pod: PodInfo, reason: str, message: str, warning: bool = False
) -> None:
    if kube is not None:
        kube.record_event(pod, reason, message, warning=warning)


def unclassified_text(result: EngineUnmountResult) -> str:
    """For a log line or an Event: which processes a forced unmount stopped without a
    complete look at the container's open files, and why ("" where there were none)."""
    pids = result.unclassified_pids
    if not pids:
        return ""
    shown = ", ".join(map(str, pids[:10])) + (f" and {len(pids) - 10} more" if pids[10:] else "")
    return (
        f"; the look at its open files could not finish ({result.unclassified_why}), so the "
        f"GPU was revoked and its nodes removed first, then PIDs {shown}, which the look "
        "could not clear, were stopped"
    )


def count_failure(metrics: Metrics, operation: str, exc: Exception) -> None:
    """A call that failed here: `conflict` or `error`, and the reason the caller was given."""
    if isinstance(exc, ApiError | HotmountError):
        code = getattr(exc, "code", None) or getattr(exc, "http_status", 500)
        metrics.operations.labels(operation, "conflict" if code == 409 else "error").inc()
        reason = getattr(exc, "reason", None) or type(exc).__name__
        metrics.refused.labels(operation, reason).inc()
    else:
        metrics.operations.labels(operation, "error").inc()


@contextmanager
def measure(metrics: Metrics, operation: str) -> Iterator[None]:
    """Counts and times an operation done here: entered once its pod is known to be on
    this node (a call forwarded to the pod's node is counted as `forwarded` instead,
    agent/operations/placement.py)."""
    started = time.perf_counter()
    try:
        yield
    except Exception as exc:
        count_failure(metrics, operation, exc)
        raise
    else:
        metrics.operations.labels(operation, "success").inc()
    finally:
        metrics.latency.labels(operation).observe(time.perf_counter() - started)


@contextmanager
def measure_failure(metrics: Metrics, operation: str | None) -> Iterator[None]:
    """Counts and times a call that fails before its operation starts (the pod's lookup,
    the forward): the caller's refusal is this agent's answer. Success counts nothing:
    the operation, here or on the pod's node, counts itself."""
    started = time.perf_counter()
    try:
        yield
    except Exception as exc:
        if operation is not None:
            count_failure(metrics, operation, exc)
            metrics.latency.labels(operation).observe(time.perf_counter() - started)
        raise


def mount_result(
    done: EngineMountResult, pod: PodInfo | None, container: ContainerInfo | None
) -> MountResult:
    """The engine's answer as the wire shows it (hotmount/wire/results.py), named after
    the pod and container it was for."""
    return wire_results.mount_result(
        done,
        namespace=pod.namespace if pod else None,
        pod=pod.name if pod else None,
        container=container.name if container else None,
    )


POD_UID = "podUid"  # ledger metadata: the pod a mount was for, told from a namesake
ONCE = "once"  # ledger metadata: "true" for a mount not carried across a container restart


def workload_of(info: PodInfo, container: ContainerInfo) -> Workload:
    """Whom a mount is for, as the engine names it when it refuses another (409)."""
    return Workload(namespace=info.namespace, pod=info.name, container=container.name)


def meta(info: PodInfo, container: ContainerInfo, user: str) -> dict[str, str]:
    return {
        "namespace": info.namespace,
        "pod": info.name,
        POD_UID: info.uid,
        "container": container.name,
        "user": user,
    }


def label(device: MountedDevice) -> str:
    return f"GPU {device.index} ({device.key})" if device.index is not None else device.key


def device_label(device: Device) -> str:
    return f"{device.index} ({device.key})" if device.index is not None else device.key
