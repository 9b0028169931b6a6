"""The objects of `hotmount.io/v1alpha1` as they go on the wire: the group's names, and
the object and list wrappers that every resource's answers share (peers' answers are
validated against the same shape, agent/cluster/peer_answers.py)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

GROUP, VERSION = "hotmount.io", "v1alpha1"
GROUP_VERSION = f"{GROUP}/{VERSION}"
PREFIX = f"/apis/{GROUP}"


def kube_object(
    kind: str,
    name: str,
    status: BaseModel,
    namespace: str | None = None,
    spec: Any = None,
    created: str | None = None,
) -> dict[str, Any]:
    """A resource as Kubernetes writes one: apiVersion, kind, metadata, spec, status."""
    metadata: dict[str, Any] = {"name": name}
    if namespace:
        metadata["namespace"] = namespace
    if created:
        metadata["creationTimestamp"] = created
    obj: dict[str, Any] = {"apiVersion": GROUP_VERSION, "kind": kind, "metadata": metadata}
    if spec is not None:
        obj["spec"] = spec
    obj["status"] = status.model_dump(mode="json", by_alias=True)
    return obj


def kube_list(kind: str, items: list[dict[str, Any]]) -> dict[str, Any]:
    return {"apiVersion": GROUP_VERSION, "kind": f"{kind}List", "metadata": {}, "items": items}
