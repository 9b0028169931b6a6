"""nvcli installed the way the README tells a newcomer: `pip install './[cli]'` into a
fresh venv, and `pipx install` of the wheel, as a user who is not root, with no system
package.

The checkout is copied where that user can read it; pip builds the wheel itself and
fetches every dependency from the configured index, so this is what a laptop gets.
Then a real kubectl finds the `kubectl-gpu` the install put on PATH.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from cli import __version__

REPO = Path(__file__).resolve().parents[2]
SYSTEM_PYTHON = "/usr/bin/python3"  # Debian's: any user may run it
NOBODY = 65534
# What only a node runs: none of it belongs on a laptop.
AGENT_ONLY = ("fastapi", "uvicorn", "pyroute2", "grpcio", "protobuf", "prometheus-client",
              "starlette", "httpx", "nvidia-ml-py", "pydantic-settings")  # fmt: skip
SOURCES = ("pyproject.toml", "README.md", "hotmount", "agent", "cli")


@dataclass
class Installed:
    home: Path
    bin: Path
    env: dict[str, str]

    def run(self, *command: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            list(command), capture_output=True, text=True, env=self.env, timeout=900,
            check=check, cwd=self.home, **as_user(),
        )  # fmt: skip


def as_user() -> dict[str, object]:
    """Drop to nobody when the tests run as root (CI); a user already is not root."""
    if os.geteuid() != 0:
        return {}
    return {"user": NOBODY, "group": NOBODY, "extra_groups": []}


@pytest.fixture(scope="module")
def installed() -> Iterator[Installed]:
    if not Path(SYSTEM_PYTHON).exists():
        pytest.skip(f"no system interpreter at {SYSTEM_PYTHON}")
    home = Path(tempfile.mkdtemp(prefix="nvcli-install-", dir="/tmp"))
    home.chmod(0o755)
    try:
        checkout = home / "gpu-hotmount"
        checkout.mkdir()
        for name in SOURCES:
            source = REPO / name
            if source.is_dir():
                skip = shutil.ignore_patterns("__pycache__", "*.egg-info")
                shutil.copytree(source, checkout / name, ignore=skip)
            else:
                shutil.copy2(source, checkout / name)
        if os.geteuid() == 0:
            for path in (home, *home.rglob("*")):
                os.chown(path, NOBODY, NOBODY, follow_symlinks=False)
        keep = ("PATH", "LANG", "PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_FIND_LINKS")
        env = {k: v for k, v in os.environ.items() if k in keep}
        env.update(HOME=str(home), PIP_CACHE_DIR=str(home / ".cache" / "pip"))
        made = Installed(home, home / "venv" / "bin", env)
        made.run(SYSTEM_PYTHON, "-m", "venv", str(home / "venv"))
        done = made.run(str(made.bin / "pip"), "install", "-q", f"{checkout}[cli]", check=False)
        assert done.returncode == 0, done.stderr[-3000:]
        yield made
    finally:
        shutil.rmtree(home, ignore_errors=True)


def test_nvcli_alone_runs_from_a_fresh_venv_as_a_user(installed: Installed) -> None:
    help_ = installed.run(str(installed.bin / "nvcli"), "--help")
    assert "Usage: nvcli [OPTIONS] COMMAND" in help_.stdout
    version = installed.run(str(installed.bin / "nvcli"), "version")
    assert version.stdout.strip() == f"nvcli {__version__}"
    whoami = installed.run("id", "-u").stdout.strip()
    assert whoami != "0"


def test_no_agent_only_dependency_came_along(installed: Installed) -> None:
    listed = installed.run(str(installed.bin / "pip"), "list", "--format", "json")
    names = {p["name"].lower().replace("_", "-") for p in json.loads(listed.stdout)}
    assert {"gpu-hotmount", "typer", "pydantic", "kubernetes"} <= names
    assert names.isdisjoint(AGENT_ONLY), names & set(AGENT_ONLY)


def test_kubectl_finds_the_plugin_on_path(installed: Installed) -> None:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("no kubectl (scripts/setup.sh installs Debian's kubernetes-client)")
    assert (installed.bin / "kubectl-gpu").exists()
    env = {**installed.env, "PATH": f"{installed.bin}:{installed.env.get('PATH', '')}"}
    done = subprocess.run([kubectl, "gpu", "version"], capture_output=True, text=True,
                          env=env, timeout=120, check=False, **as_user())  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"nvcli {__version__}"
    listed = subprocess.run([kubectl, "plugin", "list"], capture_output=True, text=True,
                            env=env, timeout=120, check=False, **as_user())  # fmt: skip
    assert str(installed.bin / "kubectl-gpu") in listed.stdout
    usage = subprocess.run([kubectl, "gpu", "--help"], capture_output=True, text=True,
                           env=env, timeout=120, check=False, **as_user())  # fmt: skip
    assert "Usage: kubectl gpu [OPTIONS] COMMAND" in usage.stdout


def test_pipx_installs_the_wheel_with_both_commands(installed: Installed) -> None:
    """docs/cli.md's `pipx install './dist/<wheel>[cli]'`: a wheel pip builds from the
    checkout, installed by pipx into its own venv, its commands linked into one bin."""
    run = installed.run
    run(SYSTEM_PYTHON, "-m", "venv", str(installed.home / "pipx-venv"))
    pipx_venv = installed.home / "pipx-venv" / "bin"
    run(str(pipx_venv / "pip"), "install", "-q", "pipx")
    wheels = installed.home / "wheels"
    run(str(installed.bin / "pip"), "wheel", "-q", "--no-deps", "-w", str(wheels),
        str(installed.home / "gpu-hotmount"))  # fmt: skip
    (wheel,) = wheels.glob("gpu_hotmount-*.whl")
    env = {**installed.env, "PIPX_HOME": str(installed.home / "pipx"),
           "PIPX_BIN_DIR": str(installed.home / "pipx-bin")}  # fmt: skip
    done = subprocess.run([str(pipx_venv / "pipx"), "install", f"./{wheel.name}[cli]"],
                          capture_output=True, text=True, env=env, timeout=900, check=False,
                          cwd=wheels, **as_user())  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    for command in ("nvcli", "kubectl-gpu"):
        version = run(str(installed.home / "pipx-bin" / command), "version")
        assert version.stdout.strip() == f"nvcli {__version__}"
