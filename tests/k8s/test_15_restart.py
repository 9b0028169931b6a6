"""A container killed from inside comes back with its hot-mounted GPU, on the real node.

The kubelet restarts it with a new container ID and no devices; within one reconcile
the agent mounts the same GPU into it, keeps the pin, and says so in an Event.
"""

from __future__ import annotations

from tests.k8s import flows
from tests.k8s.flows import GRANTED
from tests.k8s.node.cluster import Node

# A shell as PID 1 dies of `kill 1` only if it handles TERM (init ignores the default).
RESTARTABLE = ["sh", "-c", "trap 'exit 1' TERM; while :; do sleep 1; done"]


def container_id(node: Node, pod: str) -> str:
    found = flows.get_pod(node, pod)
    assert found is not None
    [status] = found["status"].get("containerStatuses") or [{}]
    return str(status.get("containerID") or "") if status.get("ready") else ""


def test_a_container_killed_from_inside_gets_its_gpu_again(
    node: Node, hotmount: flows.Release
) -> None:
    manifest = flows.pod_manifest(flows.new_name("restart-pod"))
    manifest["spec"]["containers"][0]["command"] = RESTARTABLE
    with flows.running_pod(node, manifest) as pod:
        flows.nvcli_ok(node, "alice", "mount", "--name", pod, "--mount", "0")
        pin = flows.the_pin(node, pod)
        before = container_id(node, pod)

        node.kubectl("exec", pod, "--", "kill", "1")
        flows.wait_for(
            "the kubelet runs a new container", lambda: container_id(node, pod) not in ("", before)
        )
        flows.wait_for(
            "GPU 0 opens in the new container", lambda: flows.device_state(node, pod) == GRANTED, 60
        )
        assert flows.the_pin(node, pod)["metadata"]["uid"] == pin["metadata"]["uid"]
        [event] = flows.events(node, pod, "GPURemounted")
        assert "main" in event["message"]
        assert flows.mounted_uuids(node, "alice", pod) == [flows.NVML_GPUS[0].uuid]

        flows.nvcli_ok(node, "alice", "unmount", "--name", pod, "--all")
        flows.wait_for("the pin goes", lambda: not flows.pins(node, pod), 60)
