"""`nvcli --local`: the engine in this process, its results mapped onto the agent's models.

A module of its own so that only `--local` commands import the engine and the models.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hotmount.wire.errors import EXIT_AUTH, HotmountClientError, error_for, make_status
from hotmount.wire.schemas import (
    ContainerDevices,
    DeviceHolder,
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
            raise _LocalForbidden()
        from hotmount.devices.inventory import DEFAULT_CDI_DIRS
        from hotmount.engine import Engine, EngineConfig

        config = EngineConfig(
            host_root=opts.host_root or Path("/"),
            cdi_dirs=tuple(opts.cdi_dir) if opts.cdi_dir else DEFAULT_CDI_DIRS,
            **({"state_dir": opts.state_dir} if opts.state_dir else {}),
        )
        self.engine = self._call(Engine, config)

    @staticmethod
    def _call(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        from hotmount.errors import DeviceBusy, DeviceClaimed, HotmountError

        try:
            return fn(*args, **kwargs)
        except HotmountError as exc:
            details: dict[str, Any] = {}
            if isinstance(exc, DeviceBusy):
                details["holders"] = [asdict(h) for h in exc.holders]
            if isinstance(exc, DeviceClaimed):
                details["owner"] = exc.owner
            raise error_for(
                make_status(exc.http_status, exc.message, exc.reason, **details)
            ) from exc
        except PermissionError as exc:
            raise error_for(
                make_status(403, f"{exc.strerror}: {exc.filename}", "Forbidden")
            ) from exc

    def _mounted(self, d: Any) -> MountedDevice:
        return MountedDevice(key=d.key, kind=d.kind, index=d.index, uuid=d.uuid, paths=d.paths)

    def mount(self, container_id: str, devices: list[str], force: bool) -> MountResult:
        result = self._call(self.engine.mount, container_id, devices, force=force)
        return MountResult(
            container_id=str(result.container.get("id") or container_id),
            mounted=[self._mounted(d) for d in result.mounted],
            already_mounted=[self._mounted(d) for d in result.already_mounted],
        )

    def unmount(self, container_id: str, devices: list[str] | None, force: bool) -> UnmountResult:
        result = self._call(self.engine.unmount, container_id, devices, force=force)
        return UnmountResult(
            container_id=str(result.container.get("id") or container_id),
            unmounted=result.unmounted,
            not_mounted=result.not_mounted,
            stopped_pids=result.stopped_pids,
            unclassified_pids=result.unclassified_pids,
            unclassified_why=result.unclassified_why or None,
        )

    def status(self, container_id: str) -> PodDevices:
        status = self._call(self.engine.status, container_id)
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
        holders = self._call(self.engine.holders)
        devices = [
            DeviceInfo.of(
                d,
                [
                    DeviceHolder(
                        source="hotmount", container_id=c.owner, device=c.device, **c.holder
                    )
                    for c in holders.get(d.key, [])
                ],
            )
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


class _LocalForbidden(HotmountClientError):
    exit_code = EXIT_AUTH

    def __init__(self) -> None:
        super().__init__(
            make_status(
                403,
                "nvcli --local needs root: it changes cgroups and creates device nodes",
                "Forbidden",
            )
        )
