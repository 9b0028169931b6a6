"""The driver's part of the engine's mount, unmount and reconcile (hotmount/engine/core.py).

Order, so that no process sees the GPU without its libraries: a mount places the files
after the grant and before the device nodes; an unmount, and a rollback, take the nodes
out first and the files after. The records go into the ledger's pending operation
before anything is placed (hotmount/driver/steps.py), so a crash at any step is rolled
back (a mount) or forward (an unmount) by the next pass.

Every placer is opened on /proc/PID and then proven to be the container's: a PID
reused between the resolution and the open would otherwise point the placer at
another process's root and mount namespace.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from hotmount.devices.model import Device
from hotmount.driver import sources, steps
from hotmount.driver.place import DriverPlacer
from hotmount.errors import DriverRefused, DriverUnavailable, UnsafePath
from hotmount.host.containers import Container
from hotmount.hostfs import HostRoot
from hotmount.state.ledger import ContainerRecord, DriverFileRecord
from hotmount.tenantfs import workers

log = logging.getLogger(__name__)

# The engine's default (`EngineConfig.inject_driver`): only a mount that asks gets the
# files. The agent's --inject-driver is one of auto, always, never; `never` is an off
# switch that a request cannot override.
MODES = ("asked", "auto", "always", "never")


@dataclass
class DriverAddition:
    """What one mount adds: the plan, its ledger records, and the placer to do it."""

    placer: DriverPlacer
    plan: sources.DriverPlan
    records: list[DriverFileRecord]

    def place(self) -> None:
        steps.place_all(self.placer, self.records)

    def undo(self) -> None:
        steps.remove_all(self.placer, self.records)

    def summary(self) -> dict[str, object]:
        return {
            "origin": self.plan.origin,
            "files": [f.path for f in self.plan.files],
            "env": dict(self.plan.env),
            "ignoredHooks": list(self.plan.ignored_hooks),
            "notes": list(self.plan.notes),
        }


def _auto_brings_driver(proc: str, pid: int) -> bool:  # pragma: no cover - in a worker
    """`DriverPlacer.auto_brings_driver` from a placer opened here, in the worker."""
    placer = DriverPlacer(proc, pid, HostRoot(Path("/")))  # no host file is read
    try:
        return placer.auto_brings_driver()
    finally:
        placer.close()


class DriverInjection:
    """Which files a mount brings (by the node's mode and the request), and placing,
    removing and repairing them in one container."""

    def __init__(
        self,
        proc: str,
        host: HostRoot,
        files_host: HostRoot,
        cdi_dirs: tuple[str, ...],
        driver_root: str | None,
        mode: str,
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"inject_driver {mode!r} is not one of {', '.join(MODES)}")
        self.proc = proc
        self.host = host
        self.files_host = files_host
        self.cdi_dirs = cdi_dirs
        self.driver_root = driver_root
        self.mode = mode

    @contextlib.contextmanager
    def adding(
        self,
        container: Container,
        devices: list[Device],
        record: ContainerRecord,
        with_driver: bool | None,
        check: Callable[[], None],
    ) -> Iterator[DriverAddition | None]:
        """The driver's files this mount adds (None: none). Every refusal comes before
        anything changes; under `auto` that nobody asked for, a refusal means none."""
        if with_driver and self.mode == "never":
            raise DriverUnavailable(
                "this node's agent runs with --inject-driver=never: the driver's files are "
                "not brought into containers here (mount without withDriver, or start the "
                "pod with the NVIDIA runtime)"
            )
        wanted = with_driver if with_driver is not None else self.mode in ("auto", "always")
        if not wanted or record.driver:
            yield None
            return
        unasked = with_driver is None and self.mode == "auto"
        try:
            found = sources.driver_set(
                self.host, self.cdi_dirs, self.driver_root, devices, self.files_host
            )
        except DriverUnavailable:
            if not unasked:
                raise
            yield None  # auto: nothing to bring is not an error
            return
        if unasked:
            # auto's look in a kept worker (hotmount/tenantfs/workers.py), not a fork per mount. Its
            # answer is this container's: `check` after it proves the init has not exited
            # since the pidfd was taken, so the PID the worker opened was still its own.
            what = "auto's look for the container's own libcuda"
            brings = workers.call(_auto_brings_driver, (self.proc, container.init_pid), what)
            check()
            if not brings:
                yield None
                return
        with self.placer(container, check) as placer:
            addition = None
            try:
                plan = sources.plan_for(found, placer)
                # A target that holds something else (the image's own nvidia-smi)
                # is refused here, before anything changes.
                addition = DriverAddition(placer, plan, steps.records_for(plan, placer))
            except (DriverRefused, UnsafePath) as exc:
                if not unasked:
                    raise
                # Nobody asked for the files: the GPU still comes, without them.
                log.warning("not bringing the driver's files into %s: %s", container.key, exc)
            yield addition

    @contextlib.contextmanager
    def placer(self, container: Container, check: Callable[[], None]) -> Iterator[DriverPlacer]:
        """A placer on the container's init; `check` proves, once /proc/PID/root and
        ns/mnt are open, that the PID is still that init (raises ContainerNotFound)."""
        placer = DriverPlacer(self.proc, container.init_pid, self.files_host)
        try:
            check()
            yield placer
        finally:
            placer.close()

    def remove(
        self, container: Container, records: list[DriverFileRecord], check: Callable[[], None]
    ) -> tuple[list[str], list[str]]:
        """Take our files out: (removed, detached lazily)."""
        with self.placer(container, check) as placer:
            return steps.remove_all(placer, records)

    def repair(
        self, container: Container, records: list[DriverFileRecord], check: Callable[[], None]
    ) -> int:
        with self.placer(container, check) as placer:
            return steps.repair(placer, records)
