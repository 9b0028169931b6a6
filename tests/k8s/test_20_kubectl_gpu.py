"""`kubectl gpu`: nvcli as a kubectl plugin, run by the real kubectl on the real node.

kubectl finds `kubectl-gpu` on PATH (the install's console script) and runs it with the
words after `gpu`, kubectl's global flags among them: plugins take `--kubeconfig`,
`--context` and `-n` after the plugin's name (kubectl refuses them before it).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

from tests.k8s import flows
from tests.k8s.flows import ABSENT, DENIED, GRANTED, NVML_GPUS
from tests.k8s.node.cluster import Node

PLUGIN_DIR = Path(sys.executable).parent  # where the install put kubectl-gpu


def kubectl_gpu(node: Node, *args: str) -> subprocess.CompletedProcess[str]:
    config = node.kubeconfigs["alice"]
    context = yaml.safe_load(Path(config).read_text())["current-context"]
    env = {**os.environ, "PATH": f"{PLUGIN_DIR}:{os.environ['PATH']}"}
    env.pop("KUBECONFIG", None)
    command = [node.stack.kubectl, "gpu", *args, "--kubeconfig", str(config), "--context", context,
               "-n", "default"]  # fmt: skip
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=180,
                          check=False, stdin=subprocess.DEVNULL)  # fmt: skip


def test_kubectl_gpu_mounts_shows_and_unmounts(node: Node, hotmount: flows.Release) -> None:
    assert (PLUGIN_DIR / "kubectl-gpu").exists(), "pip install -e . puts kubectl-gpu there"
    with flows.running_pod(node, flows.pod_manifest(flows.new_name("plugin-pod"))) as pod:
        mounted = kubectl_gpu(node, "mount", "--name", pod, "--mount", "0", "-o", "json")
        assert mounted.returncode == 0, mounted.stderr
        assert json.loads(mounted.stdout)["mounted"][0]["uuid"] == NVML_GPUS[0].uuid
        assert flows.device_state(node, pod) == GRANTED

        status = kubectl_gpu(node, "status", "--name", pod)
        assert status.returncode == 0, status.stderr
        assert NVML_GPUS[0].uuid in status.stdout

        unmounted = kubectl_gpu(node, "unmount", "--name", pod, "--unmount", "0")
        assert unmounted.returncode == 0, unmounted.stderr
        assert flows.device_state(node, pod) in (ABSENT, DENIED)

        usage = kubectl_gpu(node, "mount", "--help")
        assert "Usage: kubectl gpu mount [OPTIONS]" in usage.stdout
