"""What a list's fan-out reads from the API server: the agent pods, and the GPU nodes.

Read as raw JSON, only the fields the fan-out needs: the official client turns 500 pods
or nodes into `V1Pod`/`V1Node` objects slowly enough (tenths of a second on a busy
core) to eat the list's own budget. Both lists ask with `resourceVersion=0`, which the
API server answers from its watch cache instead of a quorum read from etcd.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from kubernetes.client.exceptions import ApiException

from agent.errors import UpstreamError
from agent.kube.client import KubeClient

GPU_PRESENT_LABEL = "nvidia.com/gpu.present"  # set by NVIDIA's GPU feature discovery


@dataclass(frozen=True)
class Peer:
    """One agent pod: where it runs and how to reach it."""

    node: str | None
    pod: str
    ip: str | None
    phase: str
    ports: dict[str, int] = field(default_factory=dict)


def agent_peers(kube: KubeClient, namespace: str, selector: str) -> list[Peer]:
    raw = _raw(
        lambda: kube.core.list_namespaced_pod(
            namespace, label_selector=selector, resource_version="0", _preload_content=False
        ),
        "listing agents",
    )
    return [_peer(item) for item in raw.get("items") or []]


def gpu_nodes(kube: KubeClient, resource: str) -> set[str]:
    """Nodes that have GPUs: `resource` in their capacity, or GPU feature discovery's label."""
    raw = _raw(
        lambda: kube.core.list_node(resource_version="0", _preload_content=False),
        "listing nodes",
    )
    return {
        name
        for item in raw.get("items") or []
        if (name := (item.get("metadata") or {}).get("name")) and _has_gpus(item, resource)
    }


def _has_gpus(node: dict[str, Any], resource: str) -> bool:
    labels = (node.get("metadata") or {}).get("labels") or {}
    if labels.get(GPU_PRESENT_LABEL) == "true":
        return True
    capacity = (node.get("status") or {}).get("capacity") or {}
    try:
        return int(str(capacity.get(resource, "0"))) > 0
    except ValueError:
        return False


def _peer(pod: dict[str, Any]) -> Peer:
    spec, status = pod.get("spec") or {}, pod.get("status") or {}
    ports = {
        p["name"]: int(p["containerPort"])
        for c in spec.get("containers") or []
        for p in c.get("ports") or []
        if p.get("name") and p.get("containerPort")
    }
    return Peer(
        node=spec.get("nodeName"),
        pod=(pod.get("metadata") or {}).get("name", ""),
        ip=status.get("podIP"),
        phase=status.get("phase") or "Unknown",
        ports=ports,
    )


def _raw(call: Any, what: str) -> dict[str, Any]:
    try:
        response = call()
        data = json.loads(response.data)
    except ApiException as exc:
        raise UpstreamError(f"{what}: {exc.reason or exc}") from exc
    except ValueError as exc:
        raise UpstreamError(f"{what}: the API server's answer is not JSON: {exc}") from exc
    return data if isinstance(data, dict) else {}
