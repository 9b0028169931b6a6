"""One configurable host root for every path the engine reads from the host.

The agent runs in a container with the host mounted at, say, `/host`; tests point
the same code at a fixture tree. Nothing in the engine opens `/proc`, `/sys`,
`/dev` or a CDI directory except through a `HostRoot`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class HostRoot:
    root: Path = Path("/")

    def path(self, absolute: str | Path) -> Path:
        """Map an absolute host path (`/proc/1/cgroup`) under the root."""
        relative = str(absolute).lstrip("/")
        return self.root / relative if relative else self.root

    @property
    def proc(self) -> Path:
        return self.path("/proc")

    @property
    def cgroup_mount(self) -> Path:
        return self.path("/sys/fs/cgroup")
