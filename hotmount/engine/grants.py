"""The cgroup device drivers of each container directory, kept per directory.

v1 writes `devices.allow`/`devices.deny`; v2 keeps a map read by the wrapper program
(hotmount/cgroups/v2.py). Neither driver holds state, so one per directory is kept and
reused (bounded); the root cgroup restricts nothing and has none.
"""

from __future__ import annotations

import os
from pathlib import Path

from hotmount.cgroups.detect import CgroupLayout
from hotmount.cgroups.v1 import V1Devices
from hotmount.cgroups.v2 import V2Devices
from hotmount.devices.model import DeviceRule
from hotmount.engine import plan
from hotmount.state.ledger import NodeRecord


class CgroupGrants:
    def __init__(self, layout: CgroupLayout) -> None:
        self._v1_root = _normpath(layout.v1_devices_root)
        self._v2_root = _normpath(layout.v2_root)
        self._v1_dirs: dict[str, V1Devices | None] = {}
        self._v2_dirs: dict[str, V2Devices | None] = {}

    def v1(self, directory: str | None) -> V1Devices | None:
        if directory is None:
            return None
        try:
            return self._v1_dirs[directory]
        except KeyError:
            pass
        # The root cgroup restricts nothing. The drivers hold no state: kept per directory.
        v1 = None if os.path.normpath(directory) == self._v1_root else V1Devices(directory)
        if len(self._v1_dirs) > 4096:
            self._v1_dirs.clear()
        self._v1_dirs[directory] = v1
        return v1

    def v2(self, directory: str | None) -> V2Devices | None:
        if directory is None:
            return None
        try:
            return self._v2_dirs[directory]
        except KeyError:
            pass
        v2 = None if os.path.normpath(directory) == self._v2_root else V2Devices(Path(directory))
        if len(self._v2_dirs) > 4096:
            self._v2_dirs.clear()
        self._v2_dirs[directory] = v2
        return v2

    def grant_v2(self, directory: str | None, nodes: list[NodeRecord]) -> None:
        v2 = self.v2(directory)
        if v2 is not None:
            v2.grant([rule_of(n) for n in nodes])


def rule_of(node_record: NodeRecord) -> DeviceRule:
    return plan.node_of(node_record).rule


def _normpath(path: Path | None) -> str | None:
    return os.path.normpath(path) if path is not None else None
