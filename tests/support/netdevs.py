"""Real interfaces for the netdev tests: veth pairs with a random `hm` prefix, and a
fake primary interface. Never the node's own: nothing here touches an interface it did
not make."""

from __future__ import annotations

import contextlib
import secrets
import subprocess
from collections.abc import Iterator

from tests.support.slots import slot

# A routing table of this process's own: two test processes adding a default route to one
# table at once would collide (RTNETLINK: File exists).
SPARE_TABLE = str(4242 + slot())


def ip(*args: str, pid: int | None = None) -> subprocess.CompletedProcess[str]:
    enter = ["nsenter", "-t", str(pid), "-n"] if pid else []
    return subprocess.run([*enter, "ip", *args], capture_output=True, text=True, check=False)


@contextlib.contextmanager
def veth_pair() -> Iterator[tuple[str, str]]:
    """`hm<hex>a` and its peer `hm<hex>b`, deleted after (either end takes both)."""
    tag = f"hm{secrets.token_hex(3)}"
    a, b = f"{tag}a", f"{tag}b"
    ip("link", "add", a, "type", "veth", "peer", "name", b).check_returncode()
    try:
        yield a, b
    finally:
        ip("link", "del", a)


def make_primary(veth: tuple[str, str]) -> str:
    """A veth end that carries a default route, in a spare routing table: primary to the
    agent's check (it reads every table) without ever risking the node's own interface,
    should the check be broken. The route goes with the veth."""
    for end in veth:
        ip("link", "set", end, "up").check_returncode()
    ip("route", "add", "default", "dev", veth[0], "table", SPARE_TABLE).check_returncode()
    return veth[0]
