"""`nvcli --local`: the engine in this process, its results and errors mapped onto the
wire as the agent maps them (hotmount/wire/results.py), so that a call reads the same,
exit code included, with or without an agent.

A module of its own so that only `--local` commands import the engine and the models.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hotmount.wire.errors import Forbidden, error_for, make_status
from hotmount.wire.results import (
    container_id_of,
    engine_status,
    hot_holder,
    mount_result,
    unmount_result,
)
from hotmount.wire.schemas import (
    ContainerDevices,
    DeviceInfo,
    DeviceList,
    MountedDevice,
    MountResult,
    PodDevices,
    PodRef,
    ReassignResult,
    UnmountResult,
)

if TYPE_CHECKING:
    from cli.options import Common


class LocalEngine:
    """`--local`: the engine in this process, results mapped onto the agent's models."""

    def __init__(self, opts: Common) -> None:
        if os.geteuid() != 0:
            raise Forbidden(
                make_status(
                    403,
                    "nvcli --local needs root: it changes cgroups and creates device nodes",
                    "Forbidden",
                )
            )
        from hotmount.api import DEFAULT_CDI_DIRS, Engine, EngineConfig

        config = EngineConfig(
            host_root=opts.host_root or Path("/"),
            cdi_dirs=tuple(opts.cdi_dir) if opts.cdi_dir else DEFAULT_CDI_DIRS,
            **({"state_dir": opts.state_dir} if opts.state_dir else {}),
        )
        self.engine = self._guarded(Engine, config)

    @staticmethod
    def _guarded(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """`fn`, its engine errors raised as the client raises the agent's `Status` for
        them. A PermissionError has no `Status` of the agent's (there it is a 500 that
        points at the agent's log): here it is the caller's own 403."""
        from hotmount.api import HotmountError

        try:
            return fn(*args, **kwargs)
        except HotmountError as exc:
            raise error_for(engine_status(exc)) from exc
        except PermissionError as exc:
            raise error_for(
                make_status(403, f"{exc.strerror}: {exc.filename}", "Forbidden")
            ) from exc

    def mount(self, container_id: str, devices: list[str], force: bool) -> MountResult:
        """As a standalone agent's POST /v1/containers/{id}/devices answers."""
        return mount_result(self._guarded(self.engine.mount, container_id, devices, force=force))

    def unmount(self, container_id: str, devices: list[str] | None, force: bool) -> UnmountResult:
        """As a standalone agent's DELETE /v1/containers/{id}/devices/{device} answers."""
        done = self._guarded(self.engine.unmount, container_id, devices, force=force)
        return unmount_result(done, container_id_of(done, container_id))

    def status(self, container_id: str) -> PodDevices:
        status = self._guarded(self.engine.status, container_id)
        devices = []
        for d in status.devices:
            known = self.engine.inventory.get(d.key)
            devices.append(
                MountedDevice(
                    key=d.key,
                    kind=d.kind,
                    index=known.index if known else None,
                    uuid=known.uuid if known else None,
                    paths=[n.path for n in d.nodes],
                )
            )
        return PodDevices(
            containers=[
                ContainerDevices(
                    container=None,
                    container_id=status.container_id or status.key,
                    devices=devices,
                )
            ]
        )

    def list_devices(self) -> list[DeviceList]:
        holders = self._guarded(self.engine.holders)
        devices = [
            DeviceInfo.of(d, [hot_holder(c) for c in holders.get(d.key, [])])
            for d in self.engine.inventory.devices
        ]
        return [DeviceList(node=socket.gethostname(), devices=devices)]

    def move(self, device: str, source: str, target: str, force: bool) -> ReassignResult:
        unmounted = self.unmount(source, [device], force)
        mounted = self.mount(target, [device], force)
        moved = mounted.mounted + mounted.already_mounted
        return ReassignResult.model_construct(
            device=moved[0].key if moved else device,
            from_=PodRef.model_construct(namespace="", pod=source, container=None),
            to=PodRef.model_construct(namespace="", pod=target, container=None),
            unmounted=unmounted,
            mounted=mounted,
        )
