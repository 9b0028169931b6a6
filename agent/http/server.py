"""Serve the app on every `--listen` address: TCP (TLS when configured) and unix sockets.

uvicorn does not hand the TLS peer certificate to the app, and the aggregated
API needs it (X-Remote-* headers are trusted only from the front proxy). So the
TCP listener uses a small H11 protocol subclass that puts the *verified* peer
certificate into the ASGI scope.

The unix socket is root-only from birth: it is bound inside a fresh 0700 directory,
made 0600 there, and only then renamed into place (`unix_listener`), so there is no
moment between bind and chmod when another user could connect. Every connection's
peer uid (SO_PEERCRED) also goes into the scope, and the authenticator refuses any
peer but root: a socket made world-writable by hand still serves root only.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import ssl
import struct
import tempfile
from pathlib import Path
from typing import Any

import uvicorn
from starlette.types import ASGIApp, Receive, Scope, Send
from uvicorn.protocols.http.h11_impl import H11Protocol

from agent.http.deps import LISTENER_KEY, PEER_CERT_KEY, PEER_UID_KEY

log = logging.getLogger(__name__)


class _Marked:
    """Tags each request with its listener and the connection's peer certificate or uid."""

    def __init__(
        self,
        app: ASGIApp,
        listener: str,
        peer_cert: dict[str, Any] | None,
        peer_uid: int | None = None,
    ) -> None:
        self.app, self.listener, self.peer_cert, self.peer_uid = app, listener, peer_cert, peer_uid

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        scope[LISTENER_KEY] = self.listener
        if self.peer_cert:
            scope[PEER_CERT_KEY] = self.peer_cert
        if self.peer_uid is not None:
            scope[PEER_UID_KEY] = self.peer_uid
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
            log.info(
                "shutdown: dropped an idle TLS connection from %s at once (its close_notify "
                "would never come)",
                self.client and ":".join(map(str, self.client)),
            )


class UnixProtocol(H11Protocol):
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.app = _Marked(self.app, "unix", None, peer_uid(transport.get_extra_info("socket")))


def peer_uid(sock: Any) -> int:
    """The connecting process's uid as the kernel recorded it at connect() (SO_PEERCRED)."""
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return int(struct.unpack("3i", creds)[1])


def bind_private(path: Path) -> tuple[socket.socket, Path]:
    """A socket bound inside a fresh 0700 directory beside `path`, made 0600 there.

    Nobody but root can reach it yet: the directory shuts everyone else out while the
    socket's own mode is still the umask's. `publish` then moves it into place.
    """
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    staging = Path(tempfile.mkdtemp(prefix=".", dir=path.parent))  # mode 0700
    staged = staging / "s"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(str(staged))
        os.chmod(staged, 0o600)
        sock.listen(2048)
    except OSError:
        sock.close()
        with contextlib.suppress(OSError):
            staged.unlink()
        staging.rmdir()
        raise
    return sock, staged


def publish(staged: Path, path: Path) -> None:
    """Rename the socket into place (atomically replacing a stale one); drop its staging dir."""
    os.rename(staged, path)
    staged.parent.rmdir()


def unix_listener(path: Path) -> socket.socket:
    sock, staged = bind_private(path)
    try:
        publish(staged, path)
    except OSError:
        sock.close()
        raise
    return sock


def _config(app: ASGIApp, address: str, tls: dict[str, Any]) -> uvicorn.Config:
    # No X-Forwarded-* rewriting: nothing in front of the agent sets them (the API
    # server's front proxy is known by its certificate), and the middleware costs every
    # request a layer.
    common: dict[str, Any] = {
        "log_config": None,
        "access_log": False,
        "lifespan": "off",
        "proxy_headers": False,
    }
    if address.startswith("unix:"):
        return uvicorn.Config(app, http=UnixProtocol, **common)
    host, _, port = address.rpartition(":")
    return uvicorn.Config(
        app, host=host.strip("[]"), port=int(port), http=PeerCertProtocol, **tls, **common
    )


class _Server(uvicorn.Server):
    def install_signal_handlers(self) -> None:  # the agent handles signals once, for all
        pass


async def serve(app: Any, listen: list[str], tls: dict[str, Any]) -> None:
    servers = [_Server(_config(app, address, tls)) for address in listen]
    tasks = []
    for server, address in zip(servers, listen, strict=True):
        if address.startswith("unix:"):
            sockets = [unix_listener(Path(address[5:]))]
            tasks.append(asyncio.create_task(server.serve(sockets=sockets)))
        else:
            tasks.append(asyncio.create_task(server.serve()))
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
