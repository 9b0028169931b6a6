"""Network interfaces in containers: attach, detach, reconcile, with a record on disk.

Kept apart from the device ledger (its own files, `netdevs/<container>@<name>.json`
under the state directory) and driven by the engine under the container's
operation lock. Every step is written down before it is taken (the record's
`phase`, see hotmount/netdev_plan.py), so a crash at any point leaves a record
that reconcile can finish: an attach rolled back, a detach rolled forward.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import tempfile
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING

from hotmount import netdev
from hotmount.errors import ContainerNotFound, HotmountError, KernelError, NotFound
from hotmount.hostfs import HostRoot
from hotmount.netdev_plan import (
    Action,
    NetdevConflict,
    NetdevRecord,
    NetdevRefused,
    NetdevSpec,
    check_addresses,
    check_allowed,
    check_name,
    decide,
    find,
    primary_interfaces,
    restore_plan,
)

if TYPE_CHECKING:
    from pyroute2 import IPRoute

log = logging.getLogger(__name__)
_EEXIST = 17
_UNSAFE = re.compile(r"[^A-Za-z0-9_.:-]")


class NetdevNotFound(NotFound):
    reason = "NetdevNotFound"


class Netdevs:
    def __init__(self, host: HostRoot, state_dir: Path, allow: Iterable[str]) -> None:
        self.host = host
        self.allow = tuple(allow)
        self.dir = state_dir / "netdevs"
        self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)

    # -- records
    def _path(self, container: str, inside: str) -> Path:
        return self.dir / f"{_UNSAFE.sub('_', container)}@{_UNSAFE.sub('_', inside)}.json"

    def records(self, container: str | None = None) -> list[NetdevRecord]:
        out = []
        pattern = f"{_UNSAFE.sub('_', container)}@*.json" if container else "*.json"
        for path in sorted(self.dir.glob(pattern)):
            try:
                out.append(NetdevRecord.model_validate_json(path.read_bytes()))
            except FileNotFoundError:
                continue
            except ValueError as exc:
                log.warning("ignoring unreadable netdev record %s: %s", path, exc)
        return out

    def _save(self, record: NetdevRecord) -> None:
        path = self._path(record.container, record.inside)
        fd, tmp = tempfile.mkstemp(dir=self.dir, prefix=f".{path.name}.")
        try:
            os.write(fd, record.model_dump_json().encode())
            os.close(fd)
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.close(fd)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise

    def _drop(self, record: NetdevRecord) -> None:
        with contextlib.suppress(FileNotFoundError):
            self._path(record.container, record.inside).unlink()

    # -- checks, before anything is touched
    def check(self, spec: NetdevSpec, name: str) -> None:
        """Allowed, not primary, on the host now; the inside name and addresses valid."""
        check_name(spec.inside, "inside name")
        check_addresses(spec.addresses)
        with self._host() as ipr:
            links = netdev.links(ipr)
            primary = primary_interfaces(links, netdev.default_route_oifs(ipr))
        check_allowed(name, self.allow, primary)
        if not any(link.name == name for link in links):
            raise NetdevNotFound(f"interface {name} is not in the host's network namespace")

    def choose(self, candidates: Iterable[str]) -> str:
        """`withNetdev` without a name: the first of the NIC's interfaces the allow-list
        lets move (an SR-IOV VF or a macvlan child is named explicitly instead)."""
        names = list(candidates)
        for name in names:
            try:
                self.check(NetdevSpec(), name)
                return name
            except (NetdevRefused, NetdevNotFound):
                continue
        if not names:
            raise NetdevRefused("withNetdev: the RDMA device has no network interface; name one")
        raise NetdevRefused(
            f"withNetdev: none of the RDMA device's interfaces ({', '.join(names)}) may move "
            "here (allow-list, primary, or not on the host); name one"
        )

    # -- attach and detach (call under the container's operation lock)
    def attach(
        self,
        container: str,
        init_pid: int,
        start_time: int,
        spec: NetdevSpec,
        name: str,
        with_devices: list[str],
    ) -> NetdevRecord:
        self.check(spec, name)
        if self._path(container, spec.inside).exists():
            raise NetdevConflict(f"container {container} already has {spec.inside} from us")
        with self._container_ns(init_pid, start_time) as ns_fd, netdev.rtnl(ns_fd) as inside:
            if any(link.name == spec.inside for link in netdev.links(inside)):
                raise NetdevConflict(f"container {container} already has an {spec.inside}")
            with self._host() as host:
                [link] = [link for link in netdev.links(host) if link.name == name]
                record = NetdevRecord(
                    container=container,
                    init_pid=init_pid,
                    init_start_time=start_time,
                    phase="attaching",
                    host_name=name,
                    inside=spec.inside,
                    mac=link.mac,
                    mtu=link.mtu,
                    up=link.up,
                    addresses=netdev.addresses(host, link.index),
                    with_devices=with_devices,
                )
                self._save(record)  # intent first: a crash from here on is reconciled
                try:
                    netdev.move(host, link.index, ns_fd, spec.inside)
                    netdev.configure(inside, spec.inside, mtu=spec.mtu, up=True)
                    _add_addresses(inside, spec.inside, spec.addresses)
                except BaseException:
                    self._undo(record, inside, host)
                    raise
        record.phase = "attached"
        self._save(record)
        log.info("moved %s into %s as %s", name, container, spec.inside)
        return record

    def detach(self, record: NetdevRecord) -> None:
        """Back to the host under its old name and state; the record goes last."""
        record.phase = "detaching"
        self._save(record)
        try:
            with (
                self._container_ns(record.init_pid, record.init_start_time) as ns_fd,
                netdev.rtnl(ns_fd) as inside,
                self._host() as host,
            ):
                self._undo(record, inside, host, quiet=False)
        except ContainerNotFound:
            self.reconcile_one(record, alive=False)
            return
        self._drop(record)
        log.info("moved %s back from %s", record.host_name, record.container)

    def leaving(self, container: str, remaining: Iterable[str]) -> list[str]:
        """Detach the interfaces none of whose devices are left; their host names."""
        left = set(remaining)
        out = []
        for record in self.records(container):
            if not any(d in left for d in record.with_devices):
                self.detach(record)
                out.append(record.host_name)
        return out

    def _undo(
        self, record: NetdevRecord, inside: IPRoute, host: IPRoute, quiet: bool = True
    ) -> None:
        """Wherever it is, give it back its host name and state."""
        try:
            found = find(netdev.links(inside), record, record.inside)
            if found is not None:
                host_ns = self._host_ns_fd()
                try:
                    netdev.move(inside, found.index, host_ns, record.host_name)
                finally:
                    os.close(host_ns)
            self._restore(record, host)
        except HotmountError as exc:
            if not quiet:
                raise
            log.warning("rollback of %s: %s", record.host_name, exc.message)
            return
        self._drop(record)

    def _restore(self, record: NetdevRecord, host: IPRoute) -> None:
        links = netdev.links(host)
        now = find(links, record, record.host_name)
        if now is None:
            return
        taken = {link.name for link in links if link.index != now.index}
        steps = restore_plan(record, now, taken)
        netdev.configure(host, now.name, rename=steps.rename, mtu=steps.mtu)
        name = steps.rename or now.name
        _add_addresses(host, name, steps.addresses)
        netdev.configure(host, name, up=steps.up)

    # -- reconcile
    def reconcile(self, lock: Callable[[str], AbstractContextManager[None]]) -> list[str]:
        """Finish what a crash left, and forget interfaces whose container is gone."""
        done = []
        for stale in self.records():
            with lock(stale.container):
                current = [r for r in self.records(stale.container) if r.inside == stale.inside]
                if not current:
                    continue
                record = current[0]
                try:
                    action = self.reconcile_one(record, alive=None)
                except HotmountError as exc:
                    log.warning("reconcile netdev %s: %s", record.host_name, exc.message)
                    continue
                if action is not Action.KEEP:
                    done.append(f"{record.host_name}: {action}")
        return done

    def reconcile_one(self, record: NetdevRecord, alive: bool | None) -> Action:
        with contextlib.ExitStack() as stack:
            in_container = None
            ns_fd = None
            if alive is not False:
                try:
                    ns_fd = stack.enter_context(
                        self._container_ns(record.init_pid, record.init_start_time)
                    )
                except ContainerNotFound:
                    ns_fd = None
            inside = stack.enter_context(netdev.rtnl(ns_fd)) if ns_fd is not None else None
            if inside is not None:
                in_container = find(netdev.links(inside), record, record.inside)
            host = stack.enter_context(self._host())
            on_host = find(netdev.links(host), record, record.host_name)
            action = decide(record, inside is not None, in_container, on_host)
            if action is Action.MOVE_BACK:
                self._undo(record, inside, host, quiet=False)
            elif action is Action.RESTORE:
                self._restore(record, host)
                self._drop(record)
            elif action is Action.FORGET:
                self._drop(record)
            if action is not Action.KEEP:
                log.info("netdev %s of %s: %s", record.host_name, record.container, action)
            return action

    def _host_ns_fd(self) -> int:
        """The host's network namespace: its init's (hostPID: the agent's pod need not be
        hostNetwork), else, where PID 1's namespaces cannot be opened, the agent's own."""
        for path in (self.host.path("/proc/1/ns/net"), Path("/proc/self/ns/net")):
            try:
                return os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            except PermissionError:
                continue
            except OSError as exc:
                raise KernelError(f"opening {path}: {exc.strerror}") from exc
        raise KernelError("the host's network namespace cannot be opened")

    @contextlib.contextmanager
    def _host(self) -> Iterator[IPRoute]:
        fd = self._host_ns_fd()
        try:
            with netdev.rtnl(fd) as ipr:
                yield ipr
        finally:
            os.close(fd)

    @contextlib.contextmanager
    def _container_ns(self, pid: int, start_time: int) -> Iterator[int]:
        """An fd of the container's network namespace, proven to be its init's (the PID
        not reused since) and not the host's own (a hostNetwork pod)."""
        proc = self.host.path(f"/proc/{pid}")
        try:
            fd = os.open(proc / "ns" / "net", os.O_RDONLY | os.O_CLOEXEC)
        except (FileNotFoundError, ProcessLookupError) as exc:
            raise ContainerNotFound(f"process {pid} has exited") from exc
        try:
            if _start_time(proc) != start_time:
                raise ContainerNotFound(f"PID {pid} is not the container's init any more")
            host = self._host_ns_fd()
            try:
                shared = os.fstat(host).st_ino == os.fstat(fd).st_ino
            finally:
                os.close(host)
            if shared:
                raise NetdevRefused(
                    "the container shares the host's network namespace (hostNetwork): "
                    "an interface cannot move into it"
                )
            yield fd
        finally:
            os.close(fd)


def _add_addresses(ipr: IPRoute, name: str, addresses: Iterable[str]) -> None:
    for address in addresses:
        try:
            netdev.configure(ipr, name, add=[address])
        except netdev.NetlinkFailed as exc:
            if getattr(exc.__cause__, "code", None) != _EEXIST:
                raise


def _start_time(proc: Path) -> int:
    try:
        text = (proc / "stat").read_text()
    except (FileNotFoundError, ProcessLookupError) as exc:
        raise ContainerNotFound(f"{proc} has exited") from exc
    return int(text.rpartition(")")[2].split()[19])
