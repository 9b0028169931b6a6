"""NVIDIA's own device plugin (github.com/NVIDIA/k8s-device-plugin) on the fake NVML.

The tier's default `nvidia.com/gpu` plugin on the 1.37 node: the release that
tests/k8s/node/nvidia-device-plugin/go.mod pins, built from its Go module by that
directory's build.sh (cached outside the checkout), run as a host process as the
DaemonSet's container would run it. It finds the GPUs through the project's fake
`libnvidia-ml.so.1` (tests/fakes/nvml, the same file the agent reads), so both see
the same UUIDs. Its settings:

- `--device-id-strategy=uuid`, `--device-list-strategy=envvar`: the kubelet's books
  and PodResources hold GPU UUIDs, and a container gets `NVIDIA_VISIBLE_DEVICES=<uuids>`.
- `--pass-device-specs` with `--dev-root`: a container is also given `/dev/nvidia<minor>`,
  from character devices 195:<minor> made here (there is no driver: opening one answers
  ENXIO, as the agent's hot-mounted ones do).
- Health checks on: the fake serves NVML's event set and no event ever comes (no XID),
  so every GPU stays Healthy. (Without nvmlEventSetCreate the plugin died at its first
  health check with "undefined symbol": DP_DISABLE_HEALTHCHECKS=all would have been needed.)

    plugin = NvidiaDevicePlugin(binary, nvml_dir, gpus, workdir).start()
    plugin.stop()
"""

from __future__ import annotations

import os
import stat
import subprocess
from collections.abc import Sequence
from pathlib import Path

from tests.fakes import nvml as fake_nvml
from tests.fakes.nvml import FakeGpu
from tests.k8s.node import cluster

BUILD_SCRIPT = Path(__file__).resolve().parents[1] / "node" / "nvidia-device-plugin" / "build.sh"
NVIDIA_MAJOR = 195  # the driver's character device major (/dev/nvidia<minor>)
FLAGS = (
    "--device-discovery-strategy=nvml",
    "--device-id-strategy=uuid",
    "--device-list-strategy=envvar",
    "--pass-device-specs",
    "--fail-on-init-error=true",
)


CHOICE_ENV = "HOTMOUNT_K8S_DEVICE_PLUGIN"


def selected() -> bool:
    """Whether this plugin serves `nvidia.com/gpu` on the tier: HOTMOUNT_K8S_DEVICE_PLUGIN
    `nvidia` or `fake` (tests/k8s/deviceplugin's FakeGpuPlugin); NVIDIA's by default on
    1.37, the fake on 1.20 (whose kubelet the plugin was never run against here)."""
    default = "fake" if cluster.stack_version() == "1.20" else "nvidia"
    choice = os.environ.get(CHOICE_ENV, "").strip() or default
    if choice not in ("nvidia", "fake"):
        raise ValueError(f"{CHOICE_ENV}={choice!r}: nvidia or fake")
    return choice == "nvidia"


def build() -> Path:
    """The cached plugin binary (built once from its Go module: about a minute, cgo)."""
    result = subprocess.run(
        ["bash", str(BUILD_SCRIPT)], capture_output=True, text=True, check=False, timeout=1800
    )
    if result.returncode != 0:
        raise RuntimeError(f"{BUILD_SCRIPT} failed:\n{result.stderr[-6000:]}")
    return Path(result.stdout.strip().splitlines()[-1]) / "nvidia-device-plugin"


class NvidiaDevicePlugin:
    """Runs the plugin against the fake NVML in `nvml_dir` (its gpus.conf lists `gpus`).

    `workdir` holds its device-node root and log: under the node's own directory, so
    the tier's leftover sweep (cluster._clear_leftovers) finds a plugin a crash left."""

    def __init__(
        self, binary: Path, nvml_dir: Path, gpus: Sequence[FakeGpu], workdir: Path
    ) -> None:
        self.binary = binary
        self.nvml_dir = nvml_dir
        self.uuids = [gpu.uuid for gpu in gpus]
        self.dev_root = workdir / "nvidia-dev-root"
        self.log = workdir / "nvidia-device-plugin.log"
        self._minors = [gpu.minor for gpu in gpus]
        self._process: subprocess.Popen[bytes] | None = None

    def start(self) -> NvidiaDevicePlugin:
        self._make_device_nodes()
        env = fake_nvml.env(self.nvml_dir, self.nvml_dir / "gpus.conf")
        with self.log.open("ab") as log:
            self._process = subprocess.Popen(
                [str(self.binary), *FLAGS, f"--dev-root={self.dev_root}"],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                start_new_session=True,
            )  # fmt: skip
        return self

    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def log_tail(self, size: int = 4000) -> str:
        return self.log.read_text(errors="replace")[-size:] if self.log.exists() else ""

    def stop(self) -> None:
        """SIGTERM (the plugin unregisters by closing its socket), SIGKILL after 15 s."""
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=15)

    def _make_device_nodes(self) -> None:
        """`<dev-root>/dev/nvidia<minor>`: containerd stats the host path of each device spec."""
        dev = self.dev_root / "dev"
        dev.mkdir(parents=True, exist_ok=True)
        for minor in self._minors:
            path = dev / f"nvidia{minor}"
            if not path.is_char_device():
                path.unlink(missing_ok=True)
                os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(NVIDIA_MAJOR, minor))
