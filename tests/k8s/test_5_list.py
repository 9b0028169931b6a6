"""Flow 5: `nvcli list` for a user whose rights are one namespace.

docs/api.md ("Why `nvcli list` fails for a namespaced user") decides: the node's list
names holders in every namespace, so it stays whole and cluster-scoped, and the
refusal names exactly what to ask for. The API server itself refuses (the aggregated
path is authorized before the agent sees it); nvcli must turn that into the permission,
not send the user after another resource.
"""

from __future__ import annotations

import json

from tests.k8s import flows
from tests.k8s.flows import EXIT_AUTH, NVML_GPUS
from tests.k8s.node.cluster import NODE_NAME, Node


def test_list_for_a_namespaced_user_names_the_exact_permission_and_works_once_granted(
    node: Node, hotmount: flows.Release
) -> None:
    refused = flows.nvcli(node, "alice", "list")
    assert refused.returncode == EXIT_AUTH, refused.stderr
    assert "ask for list on nodedevices.hotmount.io at the cluster scope" in refused.stderr
    assert "hotmount-viewer" in refused.stderr
    assert "gpumounts" not in refused.stderr.split("nvcli status")[0], refused.stderr

    # Granted what the message names, alice sees the node's GPUs.
    binding = flows.new_name("alice-viewer")
    node.kubectl(
        "create", "clusterrolebinding", binding, "--clusterrole=hotmount-viewer", "--user=alice"
    )
    try:
        listed = flows.wait_for(
            "alice may list once bound",
            lambda: (r := flows.nvcli(node, "alice", "list", "-o", "json")).returncode == 0 and r,
            30,
        )
        text = json.dumps(json.loads(listed.stdout))
        assert NODE_NAME in text
        for gpu in NVML_GPUS:
            assert gpu.uuid in text
    finally:
        node.kubectl("delete", "clusterrolebinding", binding, check=False)
