"""Flow 17: `nvcli list` on a cluster where another node's agent cannot be reached.

A second agent is registered the way the DaemonSet's would be: a pod with the agents'
label on another GPU node (a Node object with `nvidia.com/gpu` capacity and no kubelet),
Running on an address nobody answers (TEST-NET-1, RFC 5737). A third GPU node has no
agent pod at all. The list still answers, through the real API server, with this node's
GPUs; both other nodes are named, on stderr and in `-o json`, and kubectl prints the
agent's Warning headers.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client, config

from agent.cluster.gateway import GPU_NODES_TTL
from tests.k8s import flows
from tests.k8s.flows import NAMESPACE, NVML_GPUS
from tests.k8s.node.cluster import NODE_NAME, Node

UNREACHABLE = "192.0.2.1"


def ghost_node(name: str) -> dict[str, object]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name},
        "status": {"capacity": {flows.GPU_RESOURCE: "8"}, "allocatable": {flows.GPU_RESOURCE: "8"}},
    }


@pytest.fixture
def ghosts(node: Node, hotmount: flows.Release) -> Iterator[tuple[str, str]]:
    unreachable, agentless = flows.new_name("ghost-gpu"), flows.new_name("agentless-gpu")
    pod = flows.new_name("gpu-hotmount-ghost")
    api = client.CoreV1Api(config.new_client_from_config(str(node.kubeconfigs["admin"])))
    try:
        for name in (unreachable, agentless):
            api.create_node(ghost_node(name))
        api.create_namespaced_pod(
            NAMESPACE,
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": pod, "labels": {"app.kubernetes.io/name": "gpu-hotmount"}},
                "spec": {
                    "nodeName": unreachable,
                    "containers": [
                        {
                            "name": "agent",
                            "image": "gpu-hotmount-never-runs",
                            "ports": [{"name": "https", "containerPort": 8443}],
                        }
                    ],
                },
            },
        )
        api.patch_namespaced_pod_status(
            pod,
            NAMESPACE,
            {"status": {"phase": "Running", "podIP": UNREACHABLE, "podIPs": [{"ip": UNREACHABLE}]}},
        )
        yield unreachable, agentless
    finally:
        node.kubectl("delete", "pod", pod, "-n", NAMESPACE, "--grace-period=0", "--force",
                     "--ignore-not-found", check=False)  # fmt: skip
        for name in (unreachable, agentless):
            node.kubectl("delete", "node", name, "--ignore-not-found", check=False)


def test_an_unreachable_agent_and_an_agentless_gpu_node_are_named(
    node: Node, ghosts: tuple[str, str]
) -> None:
    unreachable, agentless = ghosts

    def names_the_agentless_node() -> Any:
        listed = flows.nvcli(node, "admin", "list")
        return listed if f"node {agentless} did not answer" in listed.stderr else None

    # Agent pods are read on each list, the GPU nodes once a minute (GPU_NODES_TTL): an
    # earlier list in this tier may have read them before the ghost nodes were made.
    listed = flows.wait_for("a list names the agentless node", names_the_agentless_node,
                            GPU_NODES_TTL + 60, every=5)  # fmt: skip
    assert listed.returncode == 0, listed.stderr
    assert NODE_NAME in listed.stdout
    for gpu in NVML_GPUS:
        assert gpu.uuid in listed.stdout
    warnings = [line for line in listed.stderr.splitlines() if line.startswith("warning: ")]
    assert any(f"node {unreachable} did not answer (" in w for w in warnings), listed.stderr
    assert any(f"node {agentless} did not answer (NoAgent)" in w for w in warnings), warnings

    as_json = flows.nvcli(node, "admin", "list", "-o", "json")
    assert as_json.returncode == 0, as_json.stderr
    missing = {
        e["node"]: e["unavailable"] for e in json.loads(as_json.stdout) if "unavailable" in e
    }
    # how an address nobody answers fails depends on the network: silence, no route, RST
    assert missing[unreachable]["reason"] in ("Timeout", "Unreachable", "Refused"), missing
    assert missing[agentless]["reason"] == "NoAgent"
    assert NODE_NAME not in missing

    kubectl = node.kubectl("get", "nodedevices")
    assert f"node {unreachable} did not answer" in kubectl.stderr, kubectl.stderr
    assert NODE_NAME in kubectl.stdout
