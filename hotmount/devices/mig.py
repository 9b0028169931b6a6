"""MIG instances: a parent GPU node plus the GI and CI access capability nodes.

`/proc/driver/nvidia-caps/mig-minors` maps every *possible* capability
(`gpu<minor>/gi<g>/ci<c>/access`) to a minor of the `nvidia-caps` major; which
instances *exist* is read from `/proc/driver/nvidia/capabilities/gpu<minor>/mig`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from hotmount.hostfs import HostRoot

_MIG_MINOR_LINE = re.compile(r"^(gpu\d+/gi\d+(?:/ci\d+)?/access)\s+(\d+)$")
_CI_ACCESS = re.compile(r"gpu(\d+)/mig/gi(\d+)/ci(\d+)/access$")


@dataclass(frozen=True)
class MigInstance:
    gpu_minor: int
    gi: int
    ci: int
    gi_cap_minor: int
    ci_cap_minor: int


def parse_mig_minors(text: str) -> dict[str, int]:
    table = {}
    for line in text.splitlines():
        if match := _MIG_MINOR_LINE.match(line.strip()):
            table[match.group(1)] = int(match.group(2))
    return table


def mig_instances(host: HostRoot) -> list[MigInstance]:
    try:
        minors = parse_mig_minors(host.path("/proc/driver/nvidia-caps/mig-minors").read_text())
    except OSError:
        return []
    caps = host.path("/proc/driver/nvidia/capabilities")
    instances = []
    for access in sorted(caps.glob("gpu*/mig/gi*/ci*/access")):
        match = _CI_ACCESS.search(access.as_posix())
        if not match:
            continue
        gpu, gi, ci = (int(g) for g in match.groups())
        gi_key, ci_key = f"gpu{gpu}/gi{gi}/access", f"gpu{gpu}/gi{gi}/ci{ci}/access"
        if gi_key in minors and ci_key in minors:
            instances.append(MigInstance(gpu, gi, ci, minors[gi_key], minors[ci_key]))
    return instances
