"""/v1/containers: standalone mode (--no-kubernetes), containers by ID."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path

from agent.deps import Authz, Caller, Service
from agent.routes.pods import DevicePath
from agent.schemas import MountRequest, MountResult, PodDevices, UnmountResult

router = APIRouter(prefix="/v1/containers", tags=["containers"])
ContainerId = Annotated[str, Path(min_length=1, max_length=80)]


@router.get("/{container_id}/devices")
def container_devices(
    container_id: ContainerId, caller: Caller, authz: Authz, service: Service
) -> PodDevices:
    authz.require(caller, "get", name=container_id)
    return service.container_devices(container_id)


@router.post("/{container_id}/devices")
def mount(
    container_id: ContainerId, body: MountRequest, caller: Caller, authz: Authz, service: Service
) -> MountResult:
    authz.require(caller, "create", name=container_id)
    if body.force:
        authz.require(caller, "force", name=container_id)
    return service.mount_container(container_id, body)


@router.delete("/{container_id}/devices/{device:path}")
def unmount(
    container_id: ContainerId,
    device: DevicePath,
    caller: Caller,
    authz: Authz,
    service: Service,
    force: bool = False,
) -> UnmountResult:
    authz.require(caller, "delete", name=container_id)
    if force:
        authz.require(caller, "force", name=container_id)
    return service.unmount_container(container_id, [device], force)
