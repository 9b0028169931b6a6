"""`hotmount-agent`: wire settings, engine, Kubernetes and the routes; serve; reconcile.

`create_app(settings)` builds everything from settings (tests build their own);
nothing is created at import time.
"""

from __future__ import annotations

import gc

# No collection while the agent's imports run: FastAPI, pydantic and the engine make
# hundreds of thousands of objects and no garbage, and each full collection meanwhile
# walks them all (about a sixth of a start's CPU). Enabled again below the imports.
gc.disable()

import asyncio
import json
import logging
import sys
import time
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException

from agent import aggregated, logs, operations
from agent.auth.authenticate import Authenticator
from agent.auth.authorize import Authorizer
from agent.auth.identity import FrontProxyTrust
from agent.books.pins import HOLDER_LABELS
from agent.cluster.gateway import Gateway
from agent.config import AgentSettings, load_settings
from agent.errors import ApiError, TooManyRequests, UpstreamError, status_of
from agent.http import server
from agent.http.guard import Guard, Limits
from agent.kube.client import KubeClient
from agent.metrics import Metrics
from agent.node import Node
from agent.node.heartbeat import ReconcileHeartbeat
from agent.node.reconcile import ReconcilePass
from agent.podresources import PodResourcesClient
from agent.routes import containers, devices, forwarding, health
from hotmount.api import Engine, EngineConfig, HotmountError, ReconcileReport, set_default_deadline
from hotmount.wire.schemas import Status

gc.enable()

log = logging.getLogger("hotmount.agent")
FRONT_PROXY_CONFIGMAP = ("kube-system", "extension-apiserver-authentication")
FRONT_PROXY_WAIT = 60.0  # seconds to wait at start for an API server that does not answer yet


def engine_from(settings: AgentSettings) -> Engine:
    set_default_deadline(settings.fs_deadline)
    return Engine(
        EngineConfig(
            host_root=settings.host_root,
            cdi_dirs=tuple(settings.cdi_dir),
            state_dir=settings.state_dir,
            use_nvml=settings.use_nvml,
            stop_grace=settings.stop_grace,
            sys_root=settings.sys_root,
            netdev_allow=tuple(settings.netdev_allow),
            netdev_address_cidrs=tuple(settings.netdev_address_cidr),
            driver_root=str(settings.driver_root) if settings.driver_root else None,
            inject_driver=settings.inject_driver,
            driver_host_root=settings.driver_host_root,
            released_on_suspend=HOLDER_LABELS,
        )
    )


def front_proxy_trust(
    kube: KubeClient, ca_path: Path, wait: float = FRONT_PROXY_WAIT, every: float = 2.0
) -> FrontProxyTrust | None:
    """Read the request-header CA and allowed names; write the CA where TLS can load it.

    The CA goes into the TLS context once, at start: an API server not reachable yet
    (a node whose Service routes are still being written) is waited for, up to `wait`
    seconds, and then the agent exits, so the kubelet restarts it. Starting without the
    CA would leave the aggregated API answering 401 for the agent's whole life.
    """
    deadline = time.monotonic() + wait
    while True:
        try:
            data = kube.configmap(*FRONT_PROXY_CONFIGMAP)
            break
        except UpstreamError as exc:
            if time.monotonic() >= deadline:
                raise
            log.warning("waiting for the API server (front-proxy CA): %s", exc.message)
            time.sleep(every)
        except ApiError as exc:
            log.warning(
                "no front-proxy trust (the aggregated API will answer 401): %s", exc.message
            )
            return None
    ca = data.get("requestheader-client-ca-file")
    if not ca:
        log.warning("%s/%s has no requestheader-client-ca-file", *FRONT_PROXY_CONFIGMAP)
        return None
    ca_path.parent.mkdir(parents=True, exist_ok=True)
    ca_path.write_text(ca)
    names = json.loads(data.get("requestheader-allowed-names") or "[]")
    return FrontProxyTrust(frozenset(names))


def create_app(
    settings: AgentSettings,
    *,
    engine: Engine | None = None,
    kube: KubeClient | None = None,
    podresources: PodResourcesClient | None = None,
    front_proxy: FrontProxyTrust | None = None,
) -> FastAPI:
    engine = engine or engine_from(settings)
    gateway = None
    if settings.kubernetes:
        kube = kube or KubeClient.from_config(settings.kubeconfig, settings.kube_timeout)
        # Even before the kubelet's socket exists (gRPC connects per call): an agent that
        # started first must still check the kubelet's books, never skip them for life.
        if podresources is None:
            podresources = PodResourcesClient(str(settings.podresources_socket))
        gateway = Gateway(settings, kube)
    else:
        kube = podresources = None
    metrics = Metrics()
    node = Node.build(settings, engine, kube, podresources, metrics)

    app = FastAPI(
        title="gpu-hotmount agent",
        version="0.1.0",
        description="Hot-mount GPUs into running pods. Errors are Kubernetes Status objects.",
    )
    app.state.node = node
    # Never less than a few child deadlines: a pass is allowed its bounded failures.
    allowance = max(
        settings.reconcile_interval * settings.reconcile_stall_intervals, 3 * settings.fs_deadline
    )
    app.state.heartbeat = ReconcileHeartbeat(allowance, metrics.reconcile_last_success.set)
    app.state.settings = settings
    app.state.authenticator = Authenticator(settings, kube, front_proxy)
    app.state.authorizer = Authorizer(
        kube,
        settings.authz_cache_ttl,
        settings.pod_tokens_own_pod_only,
        refuse_unbound=settings.refuse_unbound_service_account_tokens,
        asserted_force=settings.allow_asserted_force,
    )
    app.state.gateway = gateway
    app.include_router(health.router)
    app.include_router(devices.router)
    if settings.kubernetes:
        v1, aggregated_operations = operations.routers()
        app.include_router(v1)
        app.include_router(aggregated.router)
        app.include_router(aggregated_operations)
    else:
        app.include_router(containers.router)
    _install_error_handlers(app)
    forwarding.install(app)
    limits = Limits(
        settings.max_body_bytes,
        settings.max_requests,
        settings.max_mutating,
        settings.mutating_wait,
        settings.max_mutating_per_caller,
        max_token_reviews=settings.max_token_reviews,
    )
    app.add_middleware(
        Guard,
        authenticator=app.state.authenticator,
        limits=limits,
        metrics=metrics,
        metrics_public=settings.metrics_anonymous,
    )
    app.add_middleware(logs.RequestIdMiddleware)  # outermost: logs the guard's refusals too
    return app


def _status_response(status: Status) -> JSONResponse:
    return JSONResponse(
        status.model_dump(by_alias=True, exclude_none=True), status_code=status.code
    )


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    @app.exception_handler(HotmountError)
    async def known(request: Request, exc: Exception) -> JSONResponse:
        status = status_of(exc)
        log.info(
            "refused %s %s: %s %s", request.method, request.url.path, status.code, status.message
        )
        response = _status_response(status)
        if isinstance(exc, TooManyRequests):  # a route's 429 (lists per caller), as the guard's
            response.headers["retry-after"] = str(exc.retry_after)
        return response

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        causes = [
            {"field": ".".join(str(p) for p in e.get("loc", ())), "message": e.get("msg", "")}
            for e in exc.errors()
        ]
        summary = "; ".join(f"{c['field']}: {c['message']}" for c in causes[:5])
        return _status_response(
            Status(
                reason="Invalid",
                message=summary or "invalid request",
                code=422,
                details={"causes": causes},
            )
        )

    @app.exception_handler(HTTPException)
    async def http(request: Request, exc: HTTPException) -> JSONResponse:
        reason = {404: "NotFound", 405: "MethodNotAllowed"}.get(exc.status_code, "BadRequest")
        return _status_response(
            Status(reason=reason, message=str(exc.detail), code=exc.status_code)
        )

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unexpected error on %s %s", request.method, request.url.path)
        return _status_response(status_of(exc))


class Reconciler:
    """Runs the engine's reconcile now (repairing what drifted while the agent was down),
    then every `interval` seconds."""

    def __init__(
        self, reconcile_pass: ReconcilePass, interval: float, heartbeat: ReconcileHeartbeat
    ) -> None:
        self.reconcile_pass = reconcile_pass
        self.interval = interval
        self.heartbeat = heartbeat

    def _one_pass(self) -> ReconcileReport:
        self.heartbeat.started()
        return self.reconcile_pass.reconcile()

    async def run(self) -> None:
        while True:
            try:
                report = await asyncio.to_thread(self._one_pass)
                if report.repairs or report.forgotten or report.errors:
                    log.info("reconcile: %s", report.as_dict())
                self.heartbeat.finished(ok=True)
            except Exception:
                log.exception("reconcile failed")
                self.heartbeat.finished(ok=False)
            await asyncio.sleep(self.interval)


async def _run(settings: AgentSettings) -> None:
    engine = engine_from(settings)
    kube = (
        KubeClient.from_config(settings.kubeconfig, settings.kube_timeout)
        if settings.kubernetes
        else None
    )
    front_proxy, client_ca = None, None
    if kube is not None and settings.tls_cert:
        client_ca = settings.state_dir / "requestheader-ca.crt"
        front_proxy = front_proxy_trust(kube, client_ca)
        if front_proxy is None:
            client_ca = None
    app = create_app(settings, engine=engine, kube=kube, front_proxy=front_proxy)
    if (
        not settings.kubernetes
        and not settings.token_file
        and not settings.anonymous
        and not any(a.startswith("unix:") for a in settings.listen)
    ):
        log.warning("standalone mode with no --token-file and no unix listener: nobody can call")
    reconciler = asyncio.create_task(
        Reconciler(
            app.state.node.reconciler, settings.reconcile_interval, app.state.heartbeat
        ).run()
    )
    log.info(
        "serving on %s (cgroup %s, %d devices)",
        ", ".join(settings.listen),
        engine.layout.mode,
        len(engine.inventory.devices),
    )
    try:
        tls = server.tls_options(settings.tls_cert, settings.tls_key, client_ca)
        await server.serve(app, settings.listen, tls)
    finally:
        reconciler.cancel()


def main(argv: list[str] | None = None) -> int:
    try:
        settings = load_settings(sys.argv[1:] if argv is None else argv)
    except ValidationError as exc:
        for error in exc.errors():
            print(
                f"hotmount-agent: {'.'.join(map(str, error['loc']))}: {error['msg']}",
                file=sys.stderr,
            )
        return 2
    logs.configure(settings.log_level)
    try:
        asyncio.run(_run(settings))
    except (HotmountError, UpstreamError) as exc:
        log.error("cannot start: %s", exc.message)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
