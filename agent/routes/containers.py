"""/v1/containers: standalone mode (--no-kubernetes), containers by ID.

The handlers are `async def` and hand the blocking part (authorization, the engine) to a
worker thread in one hop: a plain `def` handler costs FastAPI further hops (its response
is validated in a thread too), each dearer than a mount's own work.
"""

from __future__ import annotations

from typing import Annotated

import anyio.to_thread
from fastapi import APIRouter, Path

from agent.http.deps import Authz, Caller, Listing, Mounting
from agent.routes.pods import DevicePath
from hotmount.wire.schemas import MountRequest, MountResult, PodDevices, UnmountResult

router = APIRouter(prefix="/v1/containers", tags=["containers"])
ContainerId = Annotated[str, Path(min_length=1, max_length=80)]


@router.get("/{container_id}/devices")
async def container_devices(
    container_id: ContainerId, caller: Caller, authz: Authz, listing: Listing
) -> PodDevices:
    def work() -> PodDevices:
        authz.require(caller, "get", name=container_id)
        return listing.container_devices(container_id)

    return await anyio.to_thread.run_sync(work)


@router.post("/{container_id}/devices")
async def mount(
    container_id: ContainerId, body: MountRequest, caller: Caller, authz: Authz, mounting: Mounting
) -> MountResult:
    def work() -> MountResult:
        authz.require(caller, "create", name=container_id)
        if body.force:
            authz.require(caller, "force", name=container_id)
        return mounting.mount_container(container_id, body)

    return await anyio.to_thread.run_sync(work)


@router.delete("/{container_id}/devices/{device:path}")
async def unmount(
    container_id: ContainerId,
    device: DevicePath,
    caller: Caller,
    authz: Authz,
    mounting: Mounting,
    force: bool = False,
) -> UnmountResult:
    def work() -> UnmountResult:
        authz.require(caller, "delete", name=container_id)
        if force:
            authz.require(caller, "force", name=container_id)
        return mounting.unmount_container(container_id, [device], force)

    return await anyio.to_thread.run_sync(work)
