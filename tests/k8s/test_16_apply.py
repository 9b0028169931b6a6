"""`kubectl apply` of a GPUMount on the real node: its spec is what the pod should have.

The real API server authorizes `patch gpumounts` (hotmount-user has it) and proxies
client-side apply's JSON merge patch; kubectl validates against the server's OpenAPI.
"""

from __future__ import annotations

import json

import yaml

from tests.k8s import flows
from tests.k8s.flows import ABSENT, GRANTED
from tests.k8s.node.cluster import Node


def apply(node: Node, pod: str, *extra: str, **spec: object) -> str:
    document = {"apiVersion": "hotmount.io/v1alpha1", "kind": "GPUMount",
                "metadata": {"name": pod, "namespace": "default"}, "spec": spec}  # fmt: skip
    result = node.kubectl("apply", *extra, "-f", "-", user="alice", stdin=yaml.safe_dump(document))
    return result.stdout


def test_kubectl_apply_twice_then_edited_then_deleted(node: Node, hotmount: flows.Release) -> None:
    with flows.running_pod(node, flows.pod_manifest(flows.new_name("apply-pod"))) as pod:
        assert f"gpumount.hotmount.io/{pod}" in apply(node, pod, devices=["0"])
        assert flows.device_state(node, pod, 0) == GRANTED
        assert "unchanged" in apply(node, pod, devices=["0"])

        assert "configured" in apply(node, pod, devices=["1"])
        assert (flows.device_state(node, pod, 0), flows.device_state(node, pod, 1)) == (
            ABSENT,
            GRANTED,
        )
        got = json.loads(node.kubectl("get", "gpumount", pod, "-o", "json", user="alice").stdout)
        assert got["spec"] == {"devices": ["1"]}

        refused = node.kubectl(
            "apply", "--server-side", "-f", "-", user="alice", check=False,
            stdin=yaml.safe_dump({"apiVersion": "hotmount.io/v1alpha1", "kind": "GPUMount",
                                  "metadata": {"name": pod}, "spec": {"devices": ["0"]}}),
        )  # fmt: skip
        assert refused.returncode != 0 and "server-side apply is not supported" in refused.stderr

        node.kubectl("delete", "gpumount", pod, user="alice")
        assert flows.mounted_uuids(node, "alice", pod) == []
        flows.wait_for("the pin goes", lambda: not flows.pins(node, pod), 60)


def test_a_deleted_pod_leaves_nothing_behind(node: Node, hotmount: flows.Release) -> None:
    """Its GPUMount's spec, its pin and its GPU go with it: a new pod of the same name
    starts with none of them."""
    name = flows.new_name("gone-pod")
    with flows.running_pod(node, flows.pod_manifest(name)) as pod:
        apply(node, pod, devices=["0"])
        assert flows.device_state(node, pod, 0) == GRANTED
    flows.wait_for("the pin goes with the pod", lambda: not flows.pins(node, name), 60)
    with flows.running_pod(node, flows.pod_manifest(name)) as again:
        got = json.loads(node.kubectl("get", "gpumount", again, "-o", "json", user="alice").stdout)
        assert "spec" not in got and "annotations" not in got["metadata"], got
        assert got["status"]["containers"] == []
        assert flows.device_state(node, again, 0) == ABSENT
