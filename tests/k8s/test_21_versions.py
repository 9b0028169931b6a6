"""Flow 21: the tier runs the stack HOTMOUNT_K8S_VERSION chose, as `kubectl version` and
the node's status report it (the API server, the kubelet and, where the tier built it,
containerd): a selector that silently fell back to another stack would pass every flow."""

from __future__ import annotations

import json

from tests.k8s.node import cluster
from tests.k8s.node.cluster import Node


def test_kubectl_version_and_the_node_report_the_chosen_stack(node: Node) -> None:
    stack = node.stack
    assert stack.minor == int(cluster.stack_version().split(".")[1])
    version = json.loads(node.kubectl("version", "-o", "json").stdout)
    assert version["serverVersion"]["gitVersion"] == stack.release
    assert version["serverVersion"]["minor"].rstrip("+") == str(stack.minor)
    if stack.kubectl != "kubectl":  # the tier built its own kubectl, of the same release
        assert version["clientVersion"]["gitVersion"] == stack.release
    info = json.loads(node.kubectl("get", "node", cluster.NODE_NAME, "-o", "json").stdout)
    info = info["status"]["nodeInfo"]
    assert info["kubeletVersion"] == stack.release
    runtime = info["containerRuntimeVersion"]
    assert runtime.startswith("containerd://")
    if stack.containerd_release is not None:
        assert runtime == f"containerd://{stack.containerd_release}"
