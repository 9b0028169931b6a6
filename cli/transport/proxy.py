"""Which HTTP proxy a request goes through, as kubectl chooses it (pure: no sockets).

kubectl takes the kubeconfig's `proxy-url`, else Go's `ProxyFromEnvironment`:
`HTTPS_PROXY` for https and `HTTP_PROXY` for http (upper case before lower, no falling
back from one to the other), never for loopback, and not for a host `NO_PROXY` names.
`NO_PROXY` entries are Go's too, since cluster proxy setups are written for kubectl:
`*`; an IP or a CIDR range (`10.0.0.0/8`); a domain, which also covers its subdomains
(`example.com`), or its subdomains only (`.example.com`, `*.example.com`); each with
an optional `:port`. Python's urllib reads them differently (no CIDR ranges).
"""

from __future__ import annotations

import base64
import ipaddress
import os
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import SplitResult, unquote, urlsplit

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


@dataclass(frozen=True)
class Proxy:
    host: str
    port: int
    authorization: str | None  # Proxy-Authorization, from the proxy URL's user:password

    @classmethod
    def parse(cls, url: str) -> Proxy:
        """An `http://[user:password@]host[:port]` proxy URL (the scheme may be left out)."""
        parts = urlsplit(url if "://" in url else f"http://{url}")
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(
                f"proxy {_without_password(parts)}: only http:// proxies are supported"
            )
        try:
            port = parts.port or 80
        except ValueError as exc:  # urllib's words do not say which URL
            raise ValueError(f"proxy {_without_password(parts)}: {exc}") from None
        authorization = None
        if parts.username is not None:
            pair = f"{unquote(parts.username)}:{unquote(parts.password or '')}"
            authorization = "Basic " + base64.b64encode(pair.encode()).decode()
        return cls(parts.hostname, port, authorization)


def _without_password(parts: SplitResult) -> str:
    """The URL to name in a message: scheme and host[:port], never user:password."""
    return f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}"


def _first(environ: Mapping[str, str], *names: str) -> str:
    return next((environ[n] for n in names if environ.get(n)), "")


def environment_proxy(
    scheme: str, host: str, port: int | None = None, environ: Mapping[str, str] | None = None
) -> str | None:
    """The proxy URL from the environment for a request to `scheme://host:port`, or None."""
    environ = os.environ if environ is None else environ
    upper = scheme.upper()
    proxy = _first(environ, f"{upper}_PROXY", f"{scheme}_proxy")
    if not proxy:
        return None
    port = port or (443 if scheme == "https" else 80)
    if bypassed(host, port, _first(environ, "NO_PROXY", "no_proxy")):
        return None
    return proxy


def _ip(text: str) -> IPAddress | None:
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


def bypassed(host: str, port: int, no_proxy: str) -> bool:
    """Whether a request to `host:port` goes direct: loopback always, else by `NO_PROXY`."""
    host = host.strip().lower().strip("[]")
    ip = _ip(host)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped  # ::ffff:127.0.0.1 is loopback to Go, not to Python 3.11
    if host == "localhost" or (ip is not None and ip.is_loopback):
        return True
    return any(_matches(entry, host, ip, port) for entry in no_proxy.lower().split(","))


def _matches(entry: str, host: str, ip: IPAddress | None, port: int) -> bool:
    entry = entry.strip()
    if not entry:
        return False
    if entry == "*":
        return True
    if "/" in entry:  # a CIDR range, prefix length only (Go takes no 255.0.0.0 masks)
        if not entry.rpartition("/")[2].isdigit():
            return False
        try:
            return ip is not None and ip in ipaddress.ip_network(entry, strict=False)
        except ValueError:
            return False
    name, wanted_port = _split_port(entry)
    if not name:
        return False
    if wanted_port is not None and wanted_port != port:
        return False
    if (entry_ip := _ip(name)) is not None:
        return ip is not None and ip == entry_ip
    if name.startswith("*."):
        name = name[1:]
    if name.startswith("."):  # subdomains only
        return host.endswith(name)
    return host == name or host.endswith(f".{name}")


def _split_port(entry: str) -> tuple[str, int | None]:
    """`host:port`, `[v6]:port`, a bare IPv6 address or a bare name. A bracketed address
    without a port stays as it is, a name that matches nothing, as Go has it."""
    if entry.startswith("[") and "]:" in entry:
        name, _, port = entry[1:].partition("]:")
        return name, _port(port)
    if entry.count(":") == 1:
        name, port = entry.split(":")
        return name, _port(port)
    return entry, None


def _port(text: str) -> int | None:
    """None (any port) for `host:`, as Go has it; -1 (no port) for what is not a number."""
    if not text:
        return None
    return int(text) if text.isdigit() else -1
