"""Flow 1: a namespaced user mounts GPU 0 into a running pod with nvcli, and unmounts it."""

from __future__ import annotations

from tests.k8s import flows
from tests.k8s.flows import ABSENT, DENIED, GRANTED, NVML_GPUS
from tests.k8s.node.cluster import Node


def mount_and_unmount(node: Node, release: flows.Release) -> None:
    """Shared with flow 9: the same steps under the hardened DaemonSet."""
    name = flows.new_name("gpu-pod")
    with flows.running_pod(node, flows.pod_manifest(name)) as pod:
        assert flows.device_state(node, pod) == ABSENT
        assert flows.mounted_uuids(node, "alice", pod) == []

        flows.nvcli_ok(node, "alice", "mount", "--name", pod, "--mount", "0")

        assert flows.device_state(node, pod) == GRANTED
        assert flows.mounted_uuids(node, "alice", pod) == [NVML_GPUS[0].uuid]
        mounted = flows.events(node, pod, "GPUMounted")
        assert mounted, "no GPUMounted Event on the pod"
        assert "alice" in mounted[-1]["message"]
        status = flows.nvcli(node, "alice", "status", "--name", pod)
        assert status.returncode == 0 and NVML_GPUS[0].uuid in status.stdout, status

        flows.nvcli_ok(node, "alice", "unmount", "--name", pod, "--unmount", "0")

        assert flows.device_state(node, pod) in (ABSENT, DENIED)
        assert flows.mounted_uuids(node, "alice", pod) == []
        assert flows.events(node, pod, "GPUUnmounted")


def test_a_namespaced_user_mounts_gpu0_and_the_pod_opens_it_then_unmounts(
    node: Node, hotmount: flows.Release
) -> None:
    mount_and_unmount(node, hotmount)
