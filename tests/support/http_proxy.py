"""A real HTTP proxy on loopback that records what clients sent it.

For tests of nvcli's proxy support (kubeconfig `proxy-url`, `HTTPS_PROXY`): it tunnels
`CONNECT host:port` byte for byte, as corporate proxies do for https://, and forwards
plain-HTTP requests in absolute form (`GET http://host:port/path`). It keeps every byte a
client sent it (`received`), so a test can tell what a proxy operator could read.
"""

from __future__ import annotations

import contextlib
import select
import socket
import threading
from dataclasses import dataclass
from urllib.parse import urlsplit

_HEAD_END = b"\r\n\r\n"


@dataclass
class ProxiedRequest:
    """One request head the proxy got: a CONNECT, or a request to forward."""

    method: str
    target: str  # `host:port` for CONNECT, the absolute URL otherwise
    headers: dict[str, str]  # names in lower case

    @property
    def request_line(self) -> str:
        return f"{self.method} {self.target}"


class RecordingProxy:
    """`with RecordingProxy() as proxy:` ... `proxy.url`, `proxy.requests`, `proxy.received`."""

    def __init__(self, hosts: dict[str, str] | None = None) -> None:
        self.hosts = dict(hosts or {})  # the proxy's own name resolution: name -> address
        self.requests: list[ProxiedRequest] = []
        self.received = bytearray()  # every byte clients sent, tunnelled ones included
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._open: list[socket.socket] = []
        self._threads: list[threading.Thread] = []
        self._stopping = False
        self._acceptor = threading.Thread(target=self._accept, daemon=True)

    def __enter__(self) -> RecordingProxy:
        self._acceptor.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stopping = True
        socket.create_connection(("127.0.0.1", self.port)).close()  # wakes accept()
        self._acceptor.join(timeout=10)
        self._listener.close()
        with self._lock:
            opened = list(self._open)
        for sock in opened:
            with contextlib.suppress(OSError):  # closed already
                sock.shutdown(socket.SHUT_RDWR)  # wakes the relays' recv() and select()
        for thread in self._threads:
            thread.join(timeout=10)
        for sock in opened:
            sock.close()

    # -- serving
    def _accept(self) -> None:
        while True:
            client, _ = self._listener.accept()
            if self._stopping:
                client.close()
                return
            self._track(client)
            thread = threading.Thread(target=self._serve, args=(client,), daemon=True)
            self._threads.append(thread)
            thread.start()

    def _track(self, sock: socket.socket) -> None:
        with self._lock:
            self._open.append(sock)

    def _address(self, host: str, port: int) -> tuple[str, int]:
        return self.hosts.get(host, host), port

    def _recv(self, sock: socket.socket) -> bytes:
        try:
            data = sock.recv(65536)
        except OSError:
            return b""
        with self._lock:
            self.received += data
        return data

    def _serve(self, client: socket.socket) -> None:
        with contextlib.suppress(OSError):  # a side went away: the connection ends
            self._serve_requests(client)

    def _serve_requests(self, client: socket.socket) -> None:
        buffer = b""
        while True:
            while _HEAD_END not in buffer:
                data = self._recv(client)
                if not data:
                    return
                buffer += data
            head, buffer = buffer.split(_HEAD_END, 1)
            request = _parse_head(head)
            self.requests.append(request)
            if request.method == "CONNECT":
                self._tunnel(client, request, buffer)
                return
            length = int(request.headers.get("content-length") or 0)
            while len(buffer) < length:
                data = self._recv(client)
                if not data:
                    return
                buffer += data
            body, buffer = buffer[:length], buffer[length:]
            if not self._forward(client, request, body):
                return

    def _tunnel(self, client: socket.socket, request: ProxiedRequest, early: bytes) -> None:
        host, _, port = request.target.rpartition(":")
        try:
            upstream = socket.create_connection(self._address(host.strip("[]"), int(port)))
        except OSError:
            client.sendall(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\n\r\n")
            return
        self._track(upstream)
        client.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
        if early:
            upstream.sendall(early)
        peers = {client: upstream, upstream: client}
        while True:
            readable, _, _ = select.select(list(peers), [], [])
            for sock in readable:
                data = self._recv(sock) if sock is client else _recv_quiet(sock)
                if not data:
                    upstream.close()
                    client.close()
                    return
                peers[sock].sendall(data)

    def _forward(self, client: socket.socket, request: ProxiedRequest, body: bytes) -> bool:
        """One absolute-form request to its origin, in origin form, without the proxy's
        own headers; the origin's whole answer back. False when the client must go."""
        url = urlsplit(request.target)
        if url.scheme != "http" or not url.hostname:
            client.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
            return False
        path = url.path or "/"
        if url.query:
            path += f"?{url.query}"
        lines = [f"{request.method} {path} HTTP/1.1"]
        for name, value in request.headers.items():
            if not name.startswith("proxy-") and name != "connection":
                lines.append(f"{name}: {value}")
        lines.append("connection: close")
        head = ("\r\n".join(lines) + "\r\n\r\n").encode()
        try:
            upstream = socket.create_connection(self._address(url.hostname, url.port or 80))
        except OSError:
            client.sendall(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\n\r\n")
            return True
        with upstream:
            upstream.sendall(head + body)
            answer = b""
            while data := upstream.recv(65536):
                answer += data
        client.sendall(answer)  # carries its Content-Length: the client keeps its connection
        return True


def _recv_quiet(sock: socket.socket) -> bytes:
    try:
        return sock.recv(65536)
    except OSError:
        return b""


def _parse_head(head: bytes) -> ProxiedRequest:
    line, *header_lines = head.decode("latin-1").split("\r\n")
    method, target, _version = line.split(" ", 2)
    headers = {}
    for header in header_lines:
        name, _, value = header.partition(":")
        headers[name.strip().lower()] = value.strip()
    return ProxiedRequest(method, target, headers)
