"""What the engine's own higher steps (hotmount/engine/suspension.py, interfaces.py) use
of hotmount/engine/core.py's Engine: its public members, as a Protocol, so that neither
imports the module that builds them (the import graph stays a tree)."""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Protocol

from hotmount.config import EngineConfig
from hotmount.devices.inventory import Inventory
from hotmount.engine.inuse import UseCheck
from hotmount.engine.results import MountResult, UnmountResult
from hotmount.engine.session import Session, Sessions
from hotmount.host.containers import Container, ContainerRef
from hotmount.hostfs import HostRoot
from hotmount.netdev.moves import Netdevs
from hotmount.state.claims import Claim, Workload
from hotmount.state.ledger import Ledger


class EngineSurface(Protocol):
    @property
    def config(self) -> EngineConfig: ...
    @property
    def host(self) -> HostRoot: ...
    @property
    def driver_host(self) -> HostRoot: ...
    @property
    def inventory(self) -> Inventory: ...
    @property
    def ledger(self) -> Ledger: ...
    @property
    def use(self) -> UseCheck: ...
    @property
    def sessions(self) -> Sessions: ...
    @property
    def netdevs(self) -> Netdevs: ...

    def resolve(self, ref: str | ContainerRef) -> Container: ...

    def session(
        self, ref: str | ContainerRef | Container, *, locked: bool = False
    ) -> AbstractContextManager[Session]: ...

    def holders(self) -> dict[str, list[Claim]]: ...

    def mount(
        self,
        ref: Container,
        device_refs: list[str],
        force: bool = False,
        metadata: dict[str, str] | None = None,
        *,
        group: str | None = None,
        share_with: str | None = None,
        with_rdma: bool = False,
        rdma: list[str] | None = None,
        device_metadata: dict[str, dict[str, str]] | None = None,
        with_driver: bool | None = None,
        workload: Workload | None = None,
    ) -> MountResult: ...

    def unmount(self, ref: Container, device_refs: list[str]) -> UnmountResult: ...
