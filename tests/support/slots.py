"""Which test process this is, so that processes running side by side never share a port
block, a routing table or any other node-wide name they pick.

pytest-xdist names its workers `gw0`, `gw1`, ...: slot 0, 1, .... A process outside
xdist takes `HOTMOUNT_TEST_SLOT` (scripts/test.sh gives its real-node and kernel lane the
last slot, beside the workers), else slot 0.
"""

from __future__ import annotations

import os

SLOTS = 12


def slot() -> int:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if worker.startswith("gw") and worker[2:].isdigit():
        return int(worker[2:]) % SLOTS
    return int(os.environ.get("HOTMOUNT_TEST_SLOT", "0")) % SLOTS
