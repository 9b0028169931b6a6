"""Flow 7: the agent restarts (`kubectl delete pod` of its DaemonSet pod) under a working pod.

A process in the GPU pod opens the device in a loop for the whole restart: not one
open may fail, and afterwards `nvcli status` still shows the mount.
"""

from __future__ import annotations

import subprocess

from tests.k8s import flows
from tests.k8s.flows import NAMESPACE, NVML_GPUS
from tests.k8s.node.cluster import Node

# Counts opens of /dev/nvidia0 until /tmp/stop appears: ENXIO is a granted open (no driver),
# anything else (EPERM, a missing node) a failed one. Prints "opens failed" at the end;
# /tmp/opens holds the running count so the test can see the loop is alive.
LOOP = """\
n=0; bad=0
while [ ! -e /tmp/stop ]; do
  n=$((n+1))
  out=$( { [ -c /dev/nvidia0 ] && exec 3<>/dev/nvidia0; } 2>&1 ); rc=$?
  case "$out" in *"No such device or address"*) ;; *) bad=$((bad+1)); echo "$rc $out" >&2;; esac
  echo $n > /tmp/opens
done
echo "$n $bad"
"""


def opens(node: Node, pod: str) -> int:
    result = node.kubectl("exec", pod, "--", "cat", "/tmp/opens", check=False)
    return int(result.stdout.strip() or 0)


def restart_under_load(node: Node, release: flows.Release) -> None:
    """Shared with flow 9."""
    name = flows.new_name("busy-pod")
    with flows.running_pod(node, flows.pod_manifest(name)) as pod:
        flows.nvcli_ok(node, "alice", "mount", "--name", pod, "--mount", "0")
        loop = subprocess.Popen(
            [node.stack.kubectl, "--kubeconfig", str(node.kubeconfigs["admin"]), "exec", pod, "--",
             "sh", "-c", LOOP],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            flows.wait_for("the open loop runs", lambda: opens(node, pod) > 10, 60)
            before = release.agent_pod()
            assert before is not None
            node.kubectl("delete", "pod", before, "-n", NAMESPACE, "--wait=true")
            flows.wait_for(
                "a new agent pod is Ready",
                lambda: release.agent_pod() not in (None, before),
                180,
            )
            release.wait_available()
            after_restart = opens(node, pod)
            flows.wait_for("the loop goes on after", lambda: opens(node, pod) > after_restart + 10)
        finally:
            node.kubectl("exec", pod, "--", "touch", "/tmp/stop", check=False)
            out, err = loop.communicate(timeout=60)
        total, failed = map(int, out.split())
        assert failed == 0, f"{failed} of {total} opens failed: {err[-2000:]}"
        assert total > 20
        assert flows.mounted_uuids(node, "alice", pod) == [NVML_GPUS[0].uuid]
        flows.nvcli_ok(node, "alice", "unmount", "--name", pod, "--all")


def test_an_agent_restart_costs_not_one_open_and_keeps_the_mount(
    node: Node, hotmount: flows.Release
) -> None:
    restart_under_load(node, hotmount)
