"""A real HTTP(S) server on loopback that answers from a function and records each request.

For tests of nvcli's HTTP client: the client speaks to a socket, as it does in use, and
the test sees what arrived (method, raw path, query, headers, body, the client's port,
which tells one kept-open connection from several) and chooses each answer.
"""

from __future__ import annotations

import json
import ssl
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from tests.fakes.pki import CertPaths


@dataclass
class Seen:
    """One request as it arrived."""

    method: str
    target: str  # the request target as sent: path and query, or an absolute URL
    headers: dict[str, str]  # names in lower case
    content: bytes
    client_port: int

    @property
    def path(self) -> str:
        return urlsplit(self.target).path

    @property
    def raw_path(self) -> str:
        """Path and query, as the client encoded them."""
        parts = urlsplit(self.target)
        return parts.path + (f"?{parts.query}" if parts.query else "")

    @property
    def params(self) -> dict[str, str]:
        return dict(parse_qsl(urlsplit(self.target).query))

    def json(self) -> Any:
        return json.loads(self.content)


@dataclass
class Reply:
    """What the server answers; `close` drops the connection after it, unannounced."""

    status: int = 200
    json: Any = None
    text: str | None = None
    close: bool = False
    headers: dict[str, str] = field(default_factory=dict)

    def body(self) -> tuple[bytes, str]:
        if self.text is not None:
            return self.text.encode(), "text/html"
        return json.dumps(self.json).encode(), "application/json"


Handler = Callable[[Seen], Reply]


class RecordingServer:
    """`with RecordingServer(handler) as server:` ... `server.url`, `server.seen`."""

    def __init__(self, handler: Handler, tls: CertPaths | None = None) -> None:
        self.handler = handler
        self.seen: list[Seen] = []
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._request_handler())
        self._server.daemon_threads = True
        scheme = "http"
        if tls is not None:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(tls.cert, tls.key)
            self._server.socket = context.wrap_socket(self._server.socket, server_side=True)
            scheme = "https"
        self.port = self._server.server_address[1]
        self.url = f"{scheme}://127.0.0.1:{self.port}"
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    def _request_handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Recorder(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as real API servers do

            def _serve(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                seen = Seen(
                    method=self.command,
                    target=self.path,
                    headers={k.lower(): v for k, v in self.headers.items()},
                    content=self.rfile.read(length) if length else b"",
                    client_port=self.client_address[1],
                )
                server.seen.append(seen)
                reply = server.handler(seen)
                body, kind = reply.body()
                self.send_response(reply.status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                for name, value in reply.headers.items():
                    self.send_header(name, value)
                self.end_headers()
                try:
                    self.wfile.write(body)
                    self.wfile.flush()
                except (BrokenPipeError, ConnectionResetError):  # the client gave up waiting
                    self.close_connection = True
                    return
                if reply.close:
                    self.close_connection = True

            def do_GET(self) -> None:
                self._serve()

            def do_POST(self) -> None:
                self._serve()

            def do_DELETE(self) -> None:
                self._serve()

            def log_message(self, *args: object) -> None:
                pass

        return Recorder

    def __enter__(self) -> RecordingServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)
