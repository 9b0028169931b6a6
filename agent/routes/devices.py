"""/v1/devices: the node's inventory and who holds each device (both modes)."""

from __future__ import annotations

from fastapi import APIRouter

from agent.http.deps import Authz, Caller, Listing
from hotmount.wire.schemas import DeviceList

router = APIRouter(prefix="/v1", tags=["devices"])


@router.get("/devices")
def node_devices(caller: Caller, authz: Authz, listing: Listing) -> DeviceList:
    authz.require(caller, "list", resource="nodedevices")
    return listing.devices()
