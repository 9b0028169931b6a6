"""Ports a test chooses before something binds them, safe under parallel workers.

A port the kernel hands out for `bind(("127.0.0.1", 0))` is free again the moment the
socket closes, so another pytest-xdist worker could be handed it before the agent that
was meant to bind it starts. Each worker therefore draws from a block of its own, below
the kernel's ephemeral range (32768+, which `bind(0)` uses) and kube-proxy's NodePorts
(30000-32767, which a real node's iptables capture on localhost).
"""

from __future__ import annotations

import itertools
import socket

from tests.support.slots import SLOTS, slot

BLOCK = 800
FIRST = 20000  # blocks 20000-29599: one for each slot
assert FIRST + SLOTS * BLOCK <= 30000  # below kube-proxy's NodePorts
_BASE = FIRST + slot() * BLOCK
_NEXT = itertools.cycle(range(_BASE, _BASE + BLOCK))


def free_port() -> int:
    """A port of this worker's block that nothing listens on now (each call the next one)."""
    for _ in range(BLOCK):
        port = next(_NEXT)
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in {_BASE}-{_BASE + BLOCK - 1}")
