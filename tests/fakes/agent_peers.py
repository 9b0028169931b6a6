"""Stand-ins for other nodes' agents that fail the way real ones do, on real sockets.

`AnsweringPeer` answers every request with one status and body (a 503, a body that is no
list); `HangingPeer` accepts connections (the kernel completes the TCP handshake from its
backlog) and never says a word; `refused_port()` is a port with no listener, so a
connect gets RST. Each counts what reached it, so a test can prove it was never asked.
"""

from __future__ import annotations

import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from tests.support.agent import free_port


class AnsweringPeer:
    def __init__(self, status: int, body: bytes = b'{"kind":"Status"}') -> None:
        self.hits = 0
        peer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                peer.hits += 1
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

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
