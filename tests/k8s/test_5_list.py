"""Flow 5: `nvcli list` for a user whose rights are one namespace.

docs/api.md ("Who may list") decides which of the two answers the API gives: the
node's devices, or a refusal that names the exact permission to ask for. Either
way the user must not be sent after the wrong resource.
"""

from __future__ import annotations

import json

from tests.k8s import flows
from tests.k8s.flows import EXIT_AUTH, NVML_GPUS
from tests.k8s.node.cluster import NODE_NAME, Node


def test_list_for_a_namespaced_user_shows_the_node_or_names_the_permission(
    node: Node, hotmount: flows.Release
) -> None:
    listed = flows.nvcli(node, "alice", "list", "-o", "json")
    if listed.returncode == 0:
        text = json.dumps(json.loads(listed.stdout))
        assert NODE_NAME in text
        for gpu in NVML_GPUS:
            assert gpu.uuid in text
    else:
        assert listed.returncode == EXIT_AUTH, listed.stderr
        message = listed.stderr
        assert "nodedevices" in message and "hotmount.io" in message, message
        assert "gpumounts" not in message, message

    # Someone with a ClusterRoleBinding sees the node's GPUs.
    admin = flows.nvcli_ok(node, "admin", "list")
    text = json.dumps(admin)
    for gpu in NVML_GPUS:
        assert gpu.uuid in text
