"""JSON over HTTP(S) for nvcli and %gpu, on the standard library's `http.client`.

Why not httpx, which the agent uses: most of an nvcli call's wall time is Python
importing (issue 10), and httpx with httpcore and h11 was a fifth of `nvcli status`
(bench/cli_bench.py). What the client needs is small and `http.client` has all of it:
one server, a connection kept open across a command's few calls, timeouts, TLS from an
`ssl.SSLContext` (with kubectl's `tls-server-name`), an HTTP proxy (the kubeconfig's
`proxy-url`, else the environment's, as kubectl has them), and an `Authorization`
header asked for on each request, so that plugin tokens are refreshed.
"""

from __future__ import annotations

import http.client
import json
import logging
import select
import ssl
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlencode, urlsplit

from cli.transport.proxy import Proxy, environment_proxy

log = logging.getLogger("nvcli.http")

Params = Mapping[str, str] | Sequence[tuple[str, str]]


class HttpError(Exception):
    """The server could not be reached, or broke off without an answer."""


class HttpTimeout(HttpError):
    """No connection, or no answer, within the timeout."""


@dataclass(frozen=True)
class Response:
    method: str
    path: str  # the path asked for, without the query: for error messages
    status: int
    reason: str
    body: bytes

    @property
    def is_success(self) -> bool:
        return 200 <= self.status < 300

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", "replace")

    def json(self) -> Any:
        """The body as JSON; `ValueError` when it is not."""
        return json.loads(self.body)


class _TLSConnection(http.client.HTTPSConnection):
    """TLS with the name to send as SNI and to check the certificate against given
    apart from the host dialled: kubeconfig's `tls-server-name`, or through a proxy."""

    def __init__(
        self, host: str, port: int, *, context: ssl.SSLContext, timeout: float | None,
        server_name: str,
    ) -> None:  # fmt: skip
        super().__init__(host, port, timeout=timeout, context=context)
        self.tls = context
        self.server_name = server_name

    def connect(self) -> None:
        http.client.HTTPConnection.connect(self)  # TCP, and the proxy's CONNECT if set
        self.sock = self.tls.wrap_socket(self.sock, server_hostname=self.server_name)


class HttpClient:
    """Requests to one server (`base_url`, whose path prefixes every path)."""

    def __init__(
        self,
        base_url: str,
        *,
        context: ssl.SSLContext | None = None,
        authorization: Callable[[], str | None] | None = None,
        timeout: float | None = None,
        proxy: str | None = None,
        server_name: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"{base_url!r} is not an http:// or https:// URL")
        self.scheme, self.host = parts.scheme, parts.hostname
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.prefix = parts.path.rstrip("/")
        self.origin = f"{self.scheme}://{_netloc(self.host, self.port)}"  # no user:password
        self.context = context
        if parts.scheme == "https" and context is None:
            self.context = ssl.create_default_context()
        self.server_name = server_name or self.host
        try:  # now, not in the TLS handshake, where a failure leaves the socket open
            self.server_name.encode("idna")
        except UnicodeError as exc:
            why = f"{self.server_name!r} is not a host name TLS can check: {exc}"
            raise ValueError(why) from None
        self.authorization = authorization
        self.timeout = timeout
        chosen = proxy or environment_proxy(parts.scheme, self.host, self.port)
        self.proxy = Proxy.parse(chosen) if chosen else None
        self.headers = dict(headers or {})
        self._connection: http.client.HTTPConnection | None = None

    def request(
        self, method: str, path: str, *, params: Params | None = None, body: Any = None
    ) -> Response:
        """One request, `body` sent as JSON; the whole answer, whatever its status.
        `HttpTimeout` or `HttpError` when there is no answer."""
        target = self.prefix + path
        if params:
            target += "?" + urlencode(params, quote_via=quote)
        headers = {**self.headers, "Accept": "application/json"}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        if self.authorization is not None and (value := self.authorization()):
            if any(c in value for c in "\r\n\0"):  # http.client's error would quote it
                raise HttpError(
                    f"{method} {self.origin}{target}: the token or password holds a line "
                    "break or a NUL, which HTTP does not allow"
                )
            if self.proxy and self.scheme == "http":
                raise HttpError(
                    f"refusing to send credentials to {self.origin} through the proxy "
                    f"{self.proxy.host}:{self.proxy.port} in clear text: use https"
                )
            headers["Authorization"] = value
        if self.proxy and self.scheme == "http" and self.proxy.authorization:
            headers["Proxy-Authorization"] = self.proxy.authorization  # no tunnel to carry it
        started = time.monotonic()
        self._log_request(method, target, headers, data)
        try:
            connection = self._connection_to_use()
            connection.request(method, self._request_target(target), data, headers)
            answer = connection.getresponse()
            content = answer.read()
        except TimeoutError as exc:
            self.close()
            raise HttpTimeout(f"{method} {self.origin}{target}: timed out") from exc
        except (OSError, http.client.HTTPException) as exc:
            self.close()
            why = str(exc) or type(exc).__name__
            raise HttpError(f"{method} {self.origin}{target}: {why}") from exc
        log.info(
            "%s %s%s %d %s in %.0f milliseconds",
            method, self.origin, target, answer.status, answer.reason,
            (time.monotonic() - started) * 1000,
        )  # fmt: skip
        return Response(method, self.prefix + path, answer.status, answer.reason, content)

    def close(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None

    def __enter__(self) -> HttpClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- connections
    def _connection_to_use(self) -> http.client.HTTPConnection:
        """The open connection, unless the server has closed it meanwhile (a socket that
        is readable before we ask is at EOF, or holds what we did not ask for)."""
        connection = self._connection
        if connection is not None and connection.sock is not None:
            poller = select.poll()  # not select(): a notebook kernel may hold fds past 1024
            poller.register(connection.sock, select.POLLIN)
            if poller.poll(0):
                self.close()
        if self._connection is None:
            self._connection = self._new_connection()
        return self._connection

    def _new_connection(self) -> http.client.HTTPConnection:
        host, port = (self.proxy.host, self.proxy.port) if self.proxy else (self.host, self.port)
        if self.scheme == "http":
            return http.client.HTTPConnection(host, port, timeout=self.timeout)
        assert self.context is not None
        connection = _TLSConnection(
            host, port, context=self.context, timeout=self.timeout, server_name=self.server_name
        )
        if self.proxy:
            if ":" in self.host and sys.version_info < (3, 12):
                # 3.11's http.client sends `CONNECT fd00::1:6443` (no brackets): refused
                raise HttpError(
                    f"{self.origin} through the proxy {self.proxy.host}:{self.proxy.port}: "
                    "an IPv6 address through a proxy needs Python 3.12 or later"
                )
            tunnel_headers = {}
            if self.proxy.authorization:
                tunnel_headers["Proxy-Authorization"] = self.proxy.authorization
            connection.set_tunnel(self.host, self.port, headers=tunnel_headers)
        return connection

    def _request_target(self, target: str) -> str:
        """Through a proxy, plain HTTP asks for the absolute URL (TLS tunnels instead)."""
        if self.proxy and self.scheme == "http":
            return f"http://{_netloc(self.host, self.port)}{target}"
        return target

    def _log_request(
        self, method: str, target: str, headers: dict[str, str], data: bytes | None
    ) -> None:
        if not log.isEnabledFor(logging.DEBUG):
            return
        shown = {k: ("<masked>" if "authorization" in k.lower() else v) for k, v in headers.items()}
        log.debug("request: %s %s%s headers: %s", method, self.origin, target, shown)
        if data:
            log.debug("request body: %s", data.decode(errors="replace")[:4096])


def _netloc(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def tls_context(verify: ssl.SSLContext | bool | str) -> ssl.SSLContext:
    """`verify` as httpx and requests take it: a context, a CA bundle's path, True for
    the system's trust store, False for no verification at all."""
    if isinstance(verify, ssl.SSLContext):
        return verify
    if isinstance(verify, str):
        return ssl.create_default_context(cafile=verify)
    if verify:
        return ssl.create_default_context()
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # CERT_NONE: no trust store to load
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


__all__ = ["HttpClient", "HttpError", "HttpTimeout", "Response", "tls_context"]
