"""Flow 17 (issue 20): idle by use on the real node. A pod annotated
`hotmount.io/idle-policy: unused` keeps its GPU while NVML shows it busy; once NVML
shows it idle, the agent records a Warning `GPUIdleSoon` on the pod, then reclaims
the GPU with `GPUReclaimed`, in that order.

The agent reads utilization from the fake NVML's activity file, which it finds through
the chart's `extraEnv` (FAKE_NVML_ACTIVITY) in the hostPath directory the test writes.
"""

from __future__ import annotations

from typing import Any

from tests.fakes import nvml as fake_nvml
from tests.fakes.nvml import FakeActivity
from tests.k8s import flows
from tests.k8s.flows import GRANTED, NVML_ACTIVITY, NVML_GPUS, RECONCILE_INTERVAL
from tests.k8s.node.cluster import Node

GPU0 = NVML_GPUS[0].uuid
TIMEOUT = "30s"  # its warning comes as soon as it is idle (the lead is at most the timeout)


def the_gpu(node: Node, pod: str) -> dict[str, Any] | None:
    status = flows.nvcli_ok(node, "alice", "status", "--name", pod)
    devices = [d for c in status["containers"] for d in c["devices"]]
    return devices[0] if devices else None


def test_an_unused_gpu_is_warned_then_reclaimed_and_a_used_one_kept(
    node: Node, hotmount: flows.Release
) -> None:
    activity = hotmount.gpus.nvml_dir / NVML_ACTIVITY
    fake_nvml.write_activity(activity, [FakeActivity(GPU0, gpu=60, memory=20)])
    pod = flows.new_name("idle")
    manifest = flows.pod_manifest(pod)
    manifest["metadata"]["annotations"] = {
        "hotmount.io/idle-policy": "unused",
        "hotmount.io/idle-timeout": TIMEOUT,
    }
    try:
        with flows.running_pod(node, manifest):
            flows.nvcli_ok(node, "alice", "mount", "--name", pod, "--mount", "0")
            looked = flows.wait_for(
                "the reconciler looked at the mount",
                lambda: (d := the_gpu(node, pod)) and d.get("idleSeconds") is not None and d,
                RECONCILE_INTERVAL * 6,
            )
            assert looked["idlePolicy"] == "unused" and looked["idlePolicyNote"] is None
            # Busy: three more passes, and not warned (idle, it would be warned at once).
            passes = []
            for _ in range(3):
                hotmount.wait_reconciles(1, "one more reconcile pass")
                passes.append(the_gpu(node, pod))
            assert all(p and p["idleSeconds"] == 0 for p in passes), passes
            assert not flows.events(node, pod, "GPUIdleSoon")
            assert flows.device_state(node, pod) == GRANTED

            fake_nvml.write_activity(activity, [])  # the notebook went to sleep
            flows.wait_for(
                "GPUReclaimed", lambda: flows.events(node, pod, "GPUReclaimed"), 180, every=2
            )
            [soon] = flows.events(node, pod, "GPUIdleSoon")
            [reclaimed] = flows.events(node, pod, "GPUReclaimed")
            assert soon["type"] == "Warning", soon
            assert "has been unused for" in soon["message"], soon
            assert "unless used" in soon["message"] and "policy unused" in soon["message"], soon
            assert soon["firstTimestamp"] < reclaimed["firstTimestamp"], (soon, reclaimed)
            assert "unused for" in reclaimed["message"], reclaimed
            assert the_gpu(node, pod) is None
            assert flows.device_state(node, pod) != GRANTED
    finally:
        activity.unlink(missing_ok=True)
