"""Run the agent as a real process against a fake cluster, with a fixture NVIDIA driver.

The agent runs in a private mount namespace in which a tmpfs over /proc/driver
holds `nvidia/gpus/<pci>/information` files, so the engine's real procfs
inventory code sees two GPUs (index and minor deliberately differ). Their nodes
are stand-ins like the kernel tests': 195:<minor> with no driver behind it.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from tests.support.ports import free_port
from tests.support.runc import RuncContainer


@dataclass(frozen=True)
class FixtureGpu:
    index: int
    uuid: str
    bus_id: str
    minor: int


GPUS = (
    FixtureGpu(0, "GPU-aaaaaaaa-0000-4000-8000-000000000000", "0000:18:00.0", 3),
    FixtureGpu(1, "GPU-bbbbbbbb-0000-4000-8000-000000000001", "0000:3b:00.0", 1),
)
AGENT_USER = "system:serviceaccount:gpu-hotmount:gpu-hotmount"


def write_driver_tree(directory: Path) -> Path:
    for gpu in GPUS:
        info = directory / "nvidia" / "gpus" / gpu.bus_id / "information"
        info.parent.mkdir(parents=True)
        info.write_text(
            f"Model: \t\t Stand-in\nGPU UUID: \t {gpu.uuid}\n"
            f"Bus Location: \t {gpu.bus_id}\nDevice Minor: \t {gpu.minor}\n"
        )
    return directory


class AgentProcess:
    """`hotmount-agent` in its own mount namespace; stopped with SIGTERM."""

    def __init__(
        self,
        workdir: Path,
        driver_tree: Path,
        args: list[str],
        port: int,
        scheme: str = "http",
        verify: Any = False,
        *,
        env: dict[str, str] | None = None,
        proc_devices: Path | None = None,
    ) -> None:
        """`env`: added to the agent's (a fake NVML's, tests/fakes/nvml); `proc_devices`:
        a file bound over /proc/devices in its namespace (majors such as nvidia-caps)."""
        self.port, self.scheme, self.verify = port, scheme, verify
        self.log = workdir / f"agent-{port}.log"
        agent = [sys.executable, "-m", "agent.main", *args]
        devices = f"mount --bind {proc_devices} /proc/devices && " if proc_devices else ""
        script = (
            f"mount --make-rprivate / && {devices}mount -t tmpfs none /proc/driver && "
            f'cp -a {driver_tree}/. /proc/driver/ && exec "$@"'
        )
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        for name in list(env):
            if name.startswith("HOTMOUNT_") or name in ("NODE_NAME", "POD_NAMESPACE"):
                env.pop(name)
        with self.log.open("w") as log:  # the child keeps its own copy of the fd
            self.process = subprocess.Popen(
                ["unshare", "-m", "sh", "-c", script, "sh", *agent],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=Path(__file__).resolve().parents[2],
            )
        self._wait_healthy()

    @property
    def url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.port}"

    def client(self, token: str | None = None, **kwargs: Any) -> httpx.Client:
        headers = {"authorization": f"Bearer {token}"} if token else {}
        return httpx.Client(
            base_url=self.url, headers=headers, verify=self.verify, timeout=60, **kwargs
        )

    def _wait_healthy(self) -> None:
        """Until /healthz answers 200; an agent that exits fails at once. The deadline is
        for a hung start only: on two loaded cores (parallel workers beside the tier's
        builds) a healthy start has taken over 30 s."""
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the agent exited: {self.log.read_text()[-3000:]}")
            try:
                with httpx.Client(verify=self.verify, timeout=1) as c:
                    if c.get(f"{self.url}/healthz").status_code == 200:
                        return
            except httpx.HTTPError:
                time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"the agent did not come up: {self.log.read_text()[-3000:]}")

    def entries(self, logger: str) -> list[dict[str, Any]]:
        """The agent's JSON log lines under `logger`, in order."""
        found = []
        for line in self.log.read_text().splitlines():
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            if isinstance(entry, dict) and entry.get("logger") == logger:
                found.append(entry)
        return found

    def messages(self, logger: str) -> list[str]:
        """What the agent logged under `logger`, in order."""
        return [str(entry.get("msg")) for entry in self.entries(logger)]

    def stop(self, grace: float = 10) -> None:
        """SIGTERM, then SIGKILL after `grace` seconds."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(grace)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def standalone_agent(
    workdir: Path,
    driver_tree: Path,
    cdi_dir: Path,
    extra: list[str] | None = None,
    state_dir: Path | None = None,
) -> AgentProcess:
    """`hotmount-agent --no-kubernetes` on a free TCP port (add listeners, tokens in `extra`)."""
    port = free_port()
    args = [
        "--no-kubernetes",
        "--listen",
        f"127.0.0.1:{port}",
        "--cdi-dir",
        str(cdi_dir),
        "--state-dir",
        str(state_dir or workdir / "state-standalone"),
        "--no-use-nvml",
        "--reconcile-interval",
        "1",
        "--stop-grace",
        "1",
        *(extra or []),
    ]
    return AgentProcess(workdir, driver_tree, args, port)


def pod_manifest(
    name: str,
    container: RuncContainer | None,
    namespace: str = "default",
    node: str = "node-a",
    container_name: str = "main",
    annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    status: dict[str, Any] = {"phase": "Running" if container else "Pending"}
    if container is not None:
        status["containerStatuses"] = [
            {
                "name": container_name,
                "containerID": f"containerd://{container.id}",
                "state": {"running": {"startedAt": "2026-11-20T00:00:00Z"}},
                "ready": True,
                "restartCount": 0,
                "image": "busybox",
                "imageID": "busybox",
            }
        ]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": str(uuid.uuid4()),
            **({"annotations": annotations} if annotations else {}),
        },
        "spec": {"nodeName": node, "containers": [{"name": container_name, "image": "busybox"}]},
        "status": status,
    }


def agent_pod_manifest(node: str, port: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"gpu-hotmount-{node}",
            "namespace": "gpu-hotmount",
            "uid": str(uuid.uuid4()),
            "labels": {"app.kubernetes.io/name": "gpu-hotmount"},
        },
        "spec": {
            "nodeName": node,
            "containers": [
                {
                    "name": "agent",
                    "image": "gpu-hotmount",
                    "ports": [{"name": "http", "containerPort": port}],
                }
            ],
        },
        "status": {"phase": "Running", "podIP": "127.0.0.1"},
    }


def cleanup_tree(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
