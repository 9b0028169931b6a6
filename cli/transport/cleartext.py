"""Credentials never cross a network in clear text, whichever way nvcli or %gpu sends them.

Kept apart (stdlib only) so that the direct `--agent` path checks it without loading
the kubeconfig reader.
"""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit


def refuse_plain_credentials(url: str, what: str) -> None:
    """A bearer token or password never goes in clear text over a network: `http://`
    is refused unless the host is this machine (loopback), where nobody else can read it."""
    parts = urlsplit(url)
    if parts.scheme != "http":
        return
    host = parts.hostname or ""
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if not loopback:
        raise ValueError(
            f"refusing to send {what} to {url} in clear text: anyone on the path could "
            "read and reuse them; use https (or http only to a loopback address)"
        )
