"""NodeDevices (cluster-scoped; name = the node): get, list. A node's devices and who
holds them, in every namespace, which is why listing them needs the cluster scope."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from fastapi import APIRouter, Request

from agent.aggregated.answers import Include, list_answer, one_answer
from agent.aggregated.objects import PREFIX, VERSION, kube_object
from agent.cluster.gateway import LOCAL_ONLY
from agent.http.deps import Authz, Caller, Gate, Listing
from agent.node import listing as node_listing
from agent.routes.forwarding import forward
from agent.routes.pods import PodName

router = APIRouter(prefix=PREFIX, tags=["aggregated"])
# A NodeDevices' creationTimestamp: when this agent started and took the node's inventory.
STARTED_AT = datetime.now(UTC).isoformat(timespec="seconds")


def _node_devices(
    listing: node_listing.Listing, node: str, fanned_out: bool = False
) -> dict[str, Any]:
    """`fanned_out`: another agent's ask for one part of a cluster's list, answered
    without reading the API server (the books of the last few seconds)."""
    devices = listing.devices(recent_books=fanned_out)
    return kube_object("NodeDevices", node, devices, created=STARTED_AT)


@router.get(f"/{VERSION}/nodedevices")
def list_node_devices(
    request: Request,
    caller: Caller,
    authz: Authz,
    listing: Listing,
    gateway: Gate,
    include: Include = "Metadata",
) -> Any:
    authz.require(caller, "list", resource="nodedevices")
    fanned_out = bool(request.headers.get(LOCAL_ONLY))
    items = [_node_devices(listing, listing.node_name or "", fanned_out)]
    return list_answer(request, caller, gateway, "NodeDevices", items, include)


@router.get(f"/{VERSION}/nodedevices/{{node}}")
def get_node_devices(
    node: PodName,
    request: Request,
    caller: Caller,
    authz: Authz,
    listing: Listing,
    gateway: Gate,
    include: Include = "Metadata",
) -> Any:
    authz.require(caller, "get", name=node, resource="nodedevices")

    if listing.node_name and node != listing.node_name:  # its node's agent answers
        answer: Any = forward(request, caller, gateway, node, f"node {node} is not this agent's")
    else:
        answer = _node_devices(listing, node)
    return one_answer(request, "NodeDevices", answer, include)
