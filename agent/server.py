"""Serve the app on every `--listen` address: TCP (TLS when configured) and unix sockets.

uvicorn does not hand the TLS peer certificate to the app, and the aggregated
API needs it (X-Remote-* headers are trusted only from the front proxy). So the
TCP listener uses a small H11 protocol subclass that puts the *verified* peer
certificate into the ASGI scope. The unix socket is made root-only (0600)
before the first request can arrive, and its requests are marked as such.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import ssl
from pathlib import Path
from typing import Any

import uvicorn
from starlette.types import ASGIApp, Receive, Scope, Send
from uvicorn.protocols.http.h11_impl import H11Protocol

from agent.deps import LISTENER_KEY, PEER_CERT_KEY


class _Marked:
    """Tags each request with its listener and the connection's peer certificate."""

    def __init__(self, app: ASGIApp, listener: str, peer_cert: dict[str, Any] | None) -> None:
        self.app, self.listener, self.peer_cert = app, listener, peer_cert

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        scope[LISTENER_KEY] = self.listener
        if self.peer_cert:
            scope[PEER_CERT_KEY] = self.peer_cert
        await self.app(scope, receive, send)


class PeerCertProtocol(H11Protocol):
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        ssl_object = transport.get_extra_info("ssl_object")
        cert = ssl_object.getpeercert() if ssl_object is not None else None
        self.app = _Marked(self.app, "tcp", cert or None)

    def shutdown(self) -> None:
        """An idle TLS keep-alive connection is dropped at once on shutdown: closing it
        gracefully waits for the peer's close_notify, which an idle pooled client (the API
        server's front proxy, another agent's gateway) never sends, so SIGTERM would hang
        until asyncio's 30 s TLS shutdown timeout, past the kubelet's grace period."""
        idle = self.cycle is None or self.cycle.response_complete
        super().shutdown()
        if idle and self.transport.get_extra_info("ssl_object") is not None:
            self.transport.abort()


class UnixProtocol(H11Protocol):
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.app = _Marked(self.app, "unix", None)


def _config(app: ASGIApp, address: str, tls: dict[str, Any]) -> uvicorn.Config:
    common: dict[str, Any] = {"log_config": None, "access_log": False, "lifespan": "off"}
    if address.startswith("unix:"):
        path = address[5:]
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        Path(path).parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        return uvicorn.Config(app, uds=path, http=UnixProtocol, **common)
    host, _, port = address.rpartition(":")
    return uvicorn.Config(
        app, host=host.strip("[]"), port=int(port), http=PeerCertProtocol, **tls, **common
    )


class _Server(uvicorn.Server):
    def install_signal_handlers(self) -> None:  # the agent handles signals once, for all
        pass


async def serve(app: Any, listen: list[str], tls: dict[str, Any]) -> None:
    servers = [_Server(_config(app, address, tls)) for address in listen]
    old_umask = os.umask(0o177)  # sockets are born 0600
    try:
        tasks = [asyncio.create_task(server.serve()) for server in servers]
        while not all(server.started for server in servers):
            if any(task.done() for task in tasks):
                break
            await asyncio.sleep(0.01)
    finally:
        os.umask(old_umask)
    for address in listen:
        if address.startswith("unix:"):
            os.chmod(address[5:], 0o600)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    waiter = asyncio.create_task(stop.wait())
    done, _ = await asyncio.wait([waiter, *tasks], return_when=asyncio.FIRST_COMPLETED)
    for server in servers:
        server.should_exit = True
    await asyncio.gather(*tasks, return_exceptions=True)
    waiter.cancel()
    for task in done:
        if task is not waiter and task.exception():
            raise task.exception()  # type: ignore[misc]


def tls_options(cert: Path | None, key: Path | None, client_ca: Path | None) -> dict[str, Any]:
    if cert is None or key is None:
        return {}
    options: dict[str, Any] = {"ssl_certfile": str(cert), "ssl_keyfile": str(key)}
    if client_ca is not None:
        # Optional: direct callers present no certificate; the front proxy does.
        options.update(ssl_ca_certs=str(client_ca), ssl_cert_reqs=ssl.CERT_OPTIONAL)
    return options
