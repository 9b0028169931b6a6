"""Which nodes a list asks, and why a node is missing from its answer. Pure.

A list across the cluster is only as good as its account of what it left out: every
node that has GPUs or an agent pod and did not answer is named with a reason a program
can branch on (docs/api.md, "Partial lists"):

    Timeout      no answer within --list-timeout (or the list's --list-deadline)
    Refused      the connection was refused (the agent is not listening)
    TLSError     the TLS handshake failed (certificate, SNI, protocol)
    Unreachable  any other failure to connect or read
    ServerError  the agent answered 5xx
    BadAnswer    the agent answered another non-200, or something that is not a list
    NoAgent      the node has GPUs and no running agent pod
"""

from __future__ import annotations

import ssl
import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass

import httpx

from agent.kube.peers import Peer


@dataclass(frozen=True)
class MissingNode:
    """Its text is made printable here, once: a message may carry whatever a peer sent
    (its Status message, its body), and it goes to kubectl, nvcli and the agent's log."""

    node: str
    reason: str
    message: str

    def __post_init__(self) -> None:
        for name in ("node", "reason", "message"):
            object.__setattr__(self, name, printable(getattr(self, name)))

    def as_json(self) -> dict[str, str]:
        return {"node": self.node, "reason": self.reason, "message": self.message}


WARNINGS_SHOWN = 10  # Warning headers per answer; the rest are counted in one more


def missing_warnings(missing: list[MissingNode]) -> list[str]:
    """Warning header values (`299 - "..."`, RFC 7234) that kubectl prints to stderr."""
    texts = [f"node {m.node} did not answer ({m.reason}): {m.message}" for m in missing]
    if len(texts) > WARNINGS_SHOWN:
        more = len(texts) - WARNINGS_SHOWN
        texts = [
            *texts[:WARNINGS_SHOWN],
            f"{more} more nodes did not answer (metadata.missingNodes)",
        ]
    return [f'299 - "{_header_safe(t)}"' for t in texts]


MESSAGE_CHARS = 500  # of a missing node's message


def printable(text: str) -> str:
    """`text` with every control and format character (ANSI escapes, C1 controls,
    newlines, bidirectional overrides) as `?`, and at most MESSAGE_CHARS long."""
    return "".join(
        "?" if unicodedata.category(c) in ("Cc", "Cf") else c for c in text[:MESSAGE_CHARS]
    )


def _header_safe(text: str) -> str:
    printable = "".join(c if " " <= c <= "~" else "?" for c in text[:300])
    return printable.replace("\\", "\\\\").replace('"', '\\"')


def plan(
    peers: Iterable[Peer], gpu_nodes: Iterable[str], here: str | None
) -> tuple[list[Peer], list[MissingNode]]:
    """One running agent to ask per other node, and the nodes that have none."""
    ask: dict[str, Peer] = {}
    idle: dict[str, Peer] = {}
    for peer in peers:
        if not peer.node or peer.node == here:
            continue
        if peer.phase == "Running" and peer.ip:
            ask.setdefault(peer.node, peer)
        else:
            idle.setdefault(peer.node, peer)
    missing = [
        MissingNode(node, "NoAgent", f"agent pod {peer.pod} is {peer.phase}, with no pod IP")
        if not peer.ip
        else MissingNode(node, "NoAgent", f"agent pod {peer.pod} is {peer.phase}")
        for node, peer in sorted(idle.items())
        if node not in ask
    ]
    known = ask.keys() | idle.keys() | {here}
    missing += [
        MissingNode(node, "NoAgent", "the node has GPUs and no agent pod")
        for node in sorted(set(gpu_nodes) - known)
    ]
    return list(ask.values()), missing


def error_reason(exc: httpx.HTTPError) -> str:
    """The reason for a request that got no HTTP answer."""
    if isinstance(exc, httpx.TimeoutException):
        return "Timeout"
    causes = list(_chain(exc))
    if any(isinstance(c, ssl.SSLError) for c in causes):
        return "TLSError"
    if any(isinstance(c, ConnectionRefusedError) for c in causes):
        return "Refused"
    text = str(exc)
    if "[SSL" in text or "CERTIFICATE" in text.upper():
        return "TLSError"
    if "refused" in text.lower():
        return "Refused"
    return "Unreachable"


def status_reason(code: int) -> str | None:
    """The reason for an HTTP answer that is not a list; None for 200."""
    if code == 200:
        return None
    return "ServerError" if code >= 500 else "BadAnswer"


def _chain(exc: BaseException) -> Iterable[BaseException]:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__
