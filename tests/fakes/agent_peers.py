"""Stand-ins for other nodes' agents that fail the way real ones do, on real sockets.

`AnsweringPeer` answers every request with one status and body (a 503, a body that is no
list, one for each path) and records each one's method, path and headers (what another
node's agent sees: tests/agent/test_token_forwarding.py); `HangingPeer` accepts
connections (the kernel completes the TCP handshake from its backlog) and never says a
word; `refused_port()` is a port with no listener, so a connect gets RST. Each counts
what reached it, so a test can prove it was never asked. Hostile ones (a compromised
node: tests/agent/test_fanout_hostile_peers.py): `StreamingPeer` sends a body in chunks
with a pause between them (a huge body, or a trickle) and notes when the asker hung up;
`HoldingPeer` holds each ask until released.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from tests.support.agent import free_port


@dataclass(frozen=True)
class Recorded:
    """One request as it reached a peer; header names in lower case, each value kept."""

    method: str
    path: str
    headers: list[tuple[str, str]]

    def header(self, name: str) -> list[str]:
        return [value for key, value in self.headers if key == name]


class AnsweringPeer:
    def __init__(
        self,
        status: int,
        body: bytes = b'{"kind":"Status"}',
        by_path: dict[str, bytes] | None = None,
    ) -> None:
        """`by_path`: the body for a path that ends so (`/gpumounts`), else `body`."""
        self.hits = 0
        self.requests: list[Recorded] = []
        peer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self._answer()

            def do_POST(self) -> None:  # forwarded mounts
                self._answer()

            def do_DELETE(self) -> None:  # forwarded unmounts
                self._answer()

            def do_PATCH(self) -> None:
                self._answer()

            def _answer(self) -> None:
                peer.hits += 1
                headers = [(k.lower(), v) for k, v in self.headers.items()]
                peer.requests.append(Recorded(self.command, self.path, headers))
                length = int(self.headers.get("content-length") or 0)
                if length:
                    self.rfile.read(length)  # the body is not kept: the headers tell who
                path = self.path.split("?")[0]
                chosen = [b for end, b in (by_path or {}).items() if path.endswith(end)]
                body_ = chosen[0] if chosen else body
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body_)))
                self.end_headers()
                self.wfile.write(body_)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.port = int(self._server.server_address[1])
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def _serve(handler: type[BaseHTTPRequestHandler]) -> tuple[ThreadingHTTPServer, int]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, int(server.server_address[1])


class _Quiet(BaseHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


class StreamingPeer:
    """Answers 200 with `chunks()`, one at a time, `pause` seconds apart, the length
    unsaid (the body ends when the connection closes). `sent` counts the bytes written;
    `hung_up` is set when a write fails: the asker closed the connection."""

    def __init__(self, chunks: Callable[[], Iterable[bytes]], pause: float = 0.0) -> None:
        self.sent = 0
        self.hung_up = threading.Event()
        self._stopped = threading.Event()
        peer = self

        class Handler(_Quiet):
            def do_GET(self) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                try:
                    for chunk in chunks():
                        self.wfile.write(chunk)
                        self.wfile.flush()
                        peer.sent += len(chunk)
                        if peer._stopped.wait(pause):
                            return
                except OSError:  # EPIPE, ECONNRESET: the asker hung up
                    peer.hung_up.set()
                    self.close_connection = True

        self._server, self.port = _serve(Handler)

    def stop(self) -> None:
        self._stopped.set()
        self._server.shutdown()
        self._server.server_close()


class HoldingPeer:
    """Takes each ask and answers it only once `release` is set (`arrived` is released
    once per ask): lists held in flight for as long as a test needs."""

    def __init__(self, body: bytes) -> None:
        self.arrived = threading.Semaphore(0)
        self.release = threading.Event()
        peer = self

        class Handler(_Quiet):
            def do_GET(self) -> None:
                peer.arrived.release()
                peer.release.wait(60)
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self._server, self.port = _serve(Handler)

    def stop(self) -> None:
        self.release.set()
        self._server.shutdown()
        self._server.server_close()


class HangingPeer:
    def __init__(self) -> None:
        self._socket = socket.socket()
        self._socket.bind(("127.0.0.1", 0))
        self._socket.listen(64)
        self.port = int(self._socket.getsockname()[1])

    def stop(self) -> None:
        self._socket.close()


def refused_port() -> int:
    """A loopback port nobody listens on (free_port closes its socket at once)."""
    return free_port()
