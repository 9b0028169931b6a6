"""The HTTP client both transports use: the agent's (`--agent`) and the API server's
(the kubeconfig's). Its own module so that cli.client and cli.transport.kubeconfig both import
it and neither imports the other back."""

from __future__ import annotations

import ssl
from collections.abc import Callable, Mapping
from urllib.parse import urlsplit

from cli import __version__
from cli.transport.http import HttpClient, tls_context
from hotmount.wire.errors import DEFAULT_TIMEOUT, InvalidRequest, make_status


def http_client(
    base_url: str,
    *,
    verify: ssl.SSLContext | bool | str = True,
    authorization: Callable[[], str | None] | None = None,
    timeout: float | None = DEFAULT_TIMEOUT,
    proxy: str | None = None,
    server_name: str | None = None,
    headers: Mapping[str, str] | None = None,
) -> HttpClient:
    """The HTTP client both transports use: TLS, a timeout, a User-Agent.

    `verify`: an `ssl.SSLContext`, a CA bundle's path, True (the system's trust store)
    or False (no verification). `authorization` is asked for the header on each request.
    """
    try:
        return HttpClient(
            base_url,
            context=tls_context(verify) if urlsplit(base_url).scheme == "https" else None,
            authorization=authorization,
            timeout=timeout,
            proxy=proxy,
            server_name=server_name,
            headers={"User-Agent": f"nvcli/{__version__}", **(headers or {})},
        )
    except ValueError as exc:  # not an http(s) URL, or a proxy nvcli cannot use
        raise InvalidRequest(make_status(400, str(exc), "BadRequest")) from exc
