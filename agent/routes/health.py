"""Liveness, readiness and metrics, read-only. The probes are unauthenticated. /metrics
names the pods that hold hot-mounted GPUs (as DCGM's exporter does), for dashboards to
join, so it is what `nodedevices` is: it takes a bearer token allowed `get` on the
non-resource URL /metrics (the shipped ClusterRole `hotmount-metrics-reader`), as the
kubelet's own /metrics does, unless `--metrics-anonymous` opens it.

The probes are `async` and never queue for the worker threads that mounts, holder
waits and forwarded calls occupy: the kubelet must not restart a busy agent. The
readiness ping to the API server runs on threads of its own, with a timeout.
"""

from __future__ import annotations

import time

import anyio
import anyio.to_thread
from fastapi import APIRouter, Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from agent.errors import NotReady, UpstreamError
from agent.http.deps import request_identity

router = APIRouter(tags=["health"])
_KUBE_CHECK_SECONDS = 5.0
_PROBE_THREADS = anyio.CapacityLimiter(2)  # apart from the default pool the routes use


@router.get("/healthz")
async def healthz(request: Request) -> dict[str, str]:
    """Live: the reconcile loop finished a pass recently (agent/node/heartbeat.py). A hung
    reconcile thread answers every route but does none of its work: restart it."""
    stalled = request.app.state.heartbeat.stalled()
    if stalled is not None:
        raise NotReady(stalled)
    return {"status": "ok"}


@router.get("/readyz")
async def readyz(request: Request) -> dict[str, str]:
    """Ready: inventory loaded, cgroup mode detected, Kubernetes reachable when enabled."""
    state = request.app.state
    engine = state.node.engine
    if engine.inventory is None or engine.layout is None:
        raise NotReady("the engine is not initialised")
    kube = state.node.kube
    if kube is not None:
        checked = getattr(state, "kube_checked", 0.0)
        if time.monotonic() - checked > _KUBE_CHECK_SECONDS:
            try:
                await anyio.to_thread.run_sync(kube.ping, limiter=_PROBE_THREADS)
            except UpstreamError as exc:
                raise NotReady(exc.message) from exc
            state.kube_checked = time.monotonic()
    return {
        "status": "ok",
        "cgroup": str(engine.layout.mode),
        "devices": str(len(engine.inventory.devices)),
    }


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    state = request.app.state
    reader = None if state.settings.metrics_anonymous else await request_identity(request)

    def scrape() -> Response:  # one worker hop: the SAR (when not cached) and the ledger
        if reader is not None:
            state.authorizer.require_path(reader, "get", "/metrics")
        node = state.node
        node.metrics.managed_containers.set(len(node.engine.mounts.records()))
        return Response(generate_latest(node.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return await anyio.to_thread.run_sync(scrape)
