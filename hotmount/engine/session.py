"""One container for the length of one operation: the container, pinned by a pidfd on
its init (its liveness), its ledger record and its lock.

The engine's mount and unmount run in a session, and so do the layers built on them
(hotmount/suspend/, hotmount/engine/interfaces.py): this public door is what they use,
never the engine's internals, so none of them imports the engine back.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from hotmount.errors import ContainerNotFound, NotInContainer
from hotmount.host import liveness
from hotmount.host.containers import Container, ContainerRef, ContainerResolver
from hotmount.host.liveness import Liveness
from hotmount.state.ledger import ContainerRecord, Ledger

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Session:
    """A container pinned for one operation: `alive` notices its exit, and PID reuse."""

    container: Container
    alive: Liveness
    ledger: Ledger

    @property
    def key(self) -> str:
        return self.container.key

    @property
    def start_time(self) -> int:
        """The init's start time, read under the pidfd: what the ledger proves it by."""
        return self.alive.start_time

    def lock(self) -> contextlib.AbstractContextManager[None]:
        """The container's operation lock (every mount, unmount and record update)."""
        return self.ledger.lock(self.container.key)

    def record(self) -> ContainerRecord:
        """The container's ledger record; a fresh one when it has none, or when its init
        changed (the old record's claims are then void and released). Call it locked."""
        container = self.container
        record = self.ledger.load(container.key)
        fresh = ContainerRecord(
            key=container.key,
            container_id=container.id,
            init_pid=container.init_pid,
            init_start_time=self.start_time,
            v1_dir=str(container.v1_devices_dir) if container.v1_devices_dir else None,
            v2_dir=str(container.v2_dir) if container.v2_dir else None,
        )
        if record is None:
            return fresh
        if (record.init_pid, record.init_start_time) != (container.init_pid, self.start_time):
            log.warning("dropping the stale record of %s: its init process changed", record.key)
            for key in record.devices:
                self.ledger.release(key, record.key)
            return fresh
        return record


class Sessions:
    """Opens sessions, and proves a record's container still alive (its init's PID and
    start time): one place for what identifies a container's processes over time."""

    def __init__(self, resolver: ContainerResolver, proc: str, ledger: Ledger) -> None:
        self.resolver = resolver
        self.proc = proc
        self.ledger = ledger

    @contextlib.contextmanager
    def open(
        self, ref: str | ContainerRef | Container, *, locked: bool = False
    ) -> Iterator[Session]:
        """The container, resolved and pinned by a pidfd until the block ends; `locked`:
        under its operation lock too (taken after the pin, released before it)."""
        container, alive = liveness.enter(self.resolver, self.proc, ref)
        with alive:
            session = Session(container, alive, self.ledger)
            if not locked:
                yield session
                return
            with session.lock():
                yield session

    def live(self, record: ContainerRecord) -> Container | None:
        """The record's container if it still runs: the same init, by PID and start time."""
        ref = (
            ContainerRef(container_id=record.container_id)
            if record.container_id
            else ContainerRef(pid=record.init_pid)
        )
        try:
            container = self.resolver.resolve(ref)
        except (ContainerNotFound, NotInContainer):
            return None
        if container.init_pid != record.init_pid:
            return None
        if liveness.start_time(self.proc, container.init_pid) != record.init_start_time:
            return None
        return container

    def record_alive(self, key: str) -> bool:
        """Whether the container `key`'s record stands for still runs."""
        record = self.ledger.load(key)
        return record is not None and self.live(record) is not None

    def proven(self, record: ContainerRecord) -> Callable[[], None]:
        """A check that the record's init still runs under its PID (not a reused one)."""

        def check() -> None:
            if self.start_time(record.init_pid) != record.init_start_time:
                raise ContainerNotFound(f"PID {record.init_pid} is no longer {record.key}'s init")

        return check

    def start_time(self, pid: int) -> int:
        """A host PID's start time: with the PID, what names one process over time."""
        return liveness.start_time(self.proc, pid)

    def pid_namespace(self, pid: int) -> str:
        """The PID namespace a host PID runs in."""
        return liveness.pid_namespace(self.proc, pid)

    def pid_in(self, pid: int, namespace: str) -> int | None:
        """A host PID as the PID namespace `namespace` numbers it (None: not in it)."""
        return liveness.pid_in(self.proc, pid, namespace)
