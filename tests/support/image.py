"""The agent image from `scripts/build-image.sh`, built at most once per test session.

tests/deploy/test_image.py checks the image itself; tests that deploy it (the real
node tier) can share the same archive instead of building it again.
"""

from __future__ import annotations

import subprocess
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "build-image.sh"
REPOSITORY = "gpu-hotmount/agent"
# build-image.sh's exit codes for "cannot build here", as its header says
EXIT_CANNOT, EXIT_OFFLINE = 3, 4


class CannotBuild(Exception):
    """Not root, a tool missing, or the Debian mirror or package index unreachable."""


@dataclass(frozen=True)
class AgentImage:
    archive: Path
    tag: str
    seconds: float  # how long the build took
    repository: str = REPOSITORY

    @property
    def reference(self) -> str:
        """What a pod spec names: `gpu-hotmount/agent:<version>`."""
        return f"{self.repository}:{self.tag}"

    @property
    def containerd_name(self) -> str:
        """The same reference normalised, as `ctr images ls` and the CRI plugin see it."""
        return f"docker.io/{self.reference}"


_built: AgentImage | None = None


def version() -> str:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]


def build_agent_image(directory: Path) -> AgentImage:
    """The archive, built into `directory` unless this process built one already."""
    global _built
    if _built is not None and _built.archive.exists():
        return _built
    archive = directory / "agent.oci.tar"
    started = time.monotonic()
    done = subprocess.run(
        ["bash", str(SCRIPT), str(archive)],
        capture_output=True, text=True, check=False, timeout=1800, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    if done.returncode in (EXIT_CANNOT, EXIT_OFFLINE):
        raise CannotBuild(done.stderr.strip().splitlines()[-1])
    if done.returncode != 0:
        raise AssertionError(f"build-image.sh exited {done.returncode}:\n{done.stderr[-6000:]}")
    assert done.stdout.strip() == str(archive), done.stdout
    _built = AgentImage(archive=archive, tag=version(), seconds=time.monotonic() - started)
    return _built
