"""Flow 4: the namespaced user moves a GPU between two pods of their namespace with nvcli move.

The API server authorizes the aggregated path itself before the agent sees it: a
cluster-scoped reassignment would need a ClusterRoleBinding. Both pods share the
namespace, so nvcli uses the namespaced reassignment, which alice's RoleBinding covers.
"""

from __future__ import annotations

from tests.k8s import flows
from tests.k8s.flows import ABSENT, DENIED, GRANTED, NVML_GPUS
from tests.k8s.node.cluster import Node


def test_a_namespaced_user_moves_a_gpu_between_two_of_their_pods(
    node: Node, hotmount: flows.Release
) -> None:
    a, b = flows.new_name("from"), flows.new_name("to")
    with (
        flows.running_pod(node, flows.pod_manifest(a)),
        flows.running_pod(node, flows.pod_manifest(b)),
    ):
        flows.nvcli_ok(node, "alice", "mount", "--name", a, "--mount", "0")

        moved = flows.nvcli(node, "alice", "move", "--gpu", "0", "--from", a, "--to", b)
        assert moved.returncode == 0, moved.stderr

        assert flows.mounted_uuids(node, "alice", a) == []
        assert flows.mounted_uuids(node, "alice", b) == [NVML_GPUS[0].uuid]
        assert flows.device_state(node, a) in (ABSENT, DENIED)
        assert flows.device_state(node, b) == GRANTED
        flows.nvcli_ok(node, "alice", "unmount", "--name", b, "--all")
