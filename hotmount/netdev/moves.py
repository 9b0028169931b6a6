"""Network interfaces in containers: attach, detach, reconcile, with a record on disk.

Kept apart from the device ledger (its own files, `netdevs/<container>@<name>.json`
under the state directory) and driven by the engine under the container's
operation lock. Every step is written down before it is taken (the record's
`phase`, see hotmount/netdev/plan.py), so a crash at any point leaves a record
that reconcile can finish: an attach rolled back, a detach rolled forward. The
namespaces are opened and proven by hotmount/netdev/namespaces.py.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING

from hotmount.errors import ContainerNotFound, HotmountError, NotFound
from hotmount.hostfs import HostRoot
from hotmount.netdev import namespaces, netlink
from hotmount.netdev.plan import (
    Action,
    LinkInfo,
    NetdevConflict,
    NetdevRecord,
    NetdevRefused,
    NetdevSpec,
    Network,
    NodeTraffic,
    carriers,
    check_address_policy,
    check_addresses,
    check_allowed,
    check_name,
    decide,
    find_inside,
    find_returned,
    primary_indexes,
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
    def __init__(
        self,
        host: HostRoot,
        state_dir: Path,
        allow: Iterable[str],
        clock: Callable[[], float] = time.monotonic,
        address_cidrs: Iterable[Network] = (),
    ) -> None:
        self.host = host
        self.allow = tuple(allow)
        self.address_cidrs = tuple(address_cidrs)  # where addresses may be set; none: no address
        self.dir = state_dir / "netdevs"
        self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._clock = clock
        # When reconcile first found a record's interface nowhere with its namespace gone
        # (Action.WAIT). In memory: an agent restart only starts the wait again.
        self._unseen_since: dict[str, float] = {}

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
        self._unseen_since.pop(self._path(record.container, record.inside).name, None)
        with contextlib.suppress(FileNotFoundError):
            self._path(record.container, record.inside).unlink()

    # -- checks, before anything is touched
    def check(self, spec: NetdevSpec, name: str) -> None:
        """Allowed, not primary, on the host now; the inside name and addresses valid, and
        the addresses inside `--netdev-address-cidr` and none the node holds (now)."""
        check_name(spec.inside, "inside name")
        check_addresses(spec.addresses)
        with namespaces.host_rtnl(self.host) as ipr:
            traffic = self._traffic(ipr)
            self._allowed_link(netlink.links(ipr), carriers(traffic), name)
            check_address_policy(spec.addresses, self.address_cidrs, traffic.held_addresses())

    def _allowed_link(
        self, links: list[LinkInfo], carrying: Mapping[int, str] | Iterable[int], name: str
    ) -> LinkInfo:
        """The link called `name` in this one listing, checked against the primary set
        and the allow-list computed from the same listing (by ifindex: a name can pass
        to another interface between two listings)."""
        check_allowed(name, self.allow, primary_interfaces(links, carrying))
        found = [link for link in links if link.name == name]
        if not found:
            raise NetdevNotFound(f"interface {name} is not in the host's network namespace")
        if found[0].index in primary_indexes(links, carrying):
            raise NetdevRefused(f"interface {name} is one of the node's primary interfaces")
        return found[0]

    def _traffic(self, host: IPRoute) -> NodeTraffic:
        """What carries the node's traffic, read at this moment (`host`: its namespace)."""
        fd = self._host_ns_fd()
        try:
            return netlink.traffic(host, fd)
        finally:
            os.close(fd)

    def choose(self, candidates: Iterable[str]) -> str:
        """`withNetdev` without a name: the first of the NIC's interfaces the allow-list
        lets move (an SR-IOV VF or a macvlan child is named explicitly instead)."""
        names = list(candidates)
        refusals = []
        for name in names:
            try:
                self.check(NetdevSpec(), name)
                return name
            except (NetdevRefused, NetdevNotFound) as exc:
                refusals.append(exc.message)
        if not names:
            raise NetdevRefused("withNetdev: the RDMA device has no network interface; name one")
        raise NetdevRefused(
            f"withNetdev: none of the RDMA device's interfaces ({', '.join(names)}) may move "
            f"here: {'; '.join(refusals)}"
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
        with (
            namespaces.container_ns(self.host, init_pid, start_time) as ns_fd,
            netlink.rtnl(ns_fd) as inside,
        ):
            if any(link.name == spec.inside for link in netlink.links(inside)):
                raise NetdevConflict(f"container {container} already has an {spec.inside}")
            with namespaces.host_rtnl(self.host) as host:
                links = netlink.links(host)
                traffic = self._traffic(host)
                link = self._allowed_link(links, carriers(traffic), name)
                held = traffic.held_addresses()
                check_address_policy(spec.addresses, self.address_cidrs, held)
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
                    addresses=netlink.addresses(host, link.index),
                    with_devices=with_devices,
                    kind=link.kind,
                    perm_mac=link.perm_mac,
                    host_index=link.index,
                    lower=link.link,
                    netns_ino=os.fstat(ns_fd).st_ino,
                )
                self._save(record)  # intent first: a crash from here on is reconciled
                try:
                    netlink.move(host, link.index, ns_fd, spec.inside)
                    moved = self._find_inside(record, inside, host)
                    if moved is None:
                        raise NetdevConflict(f"interface {name} cannot be found after the move")
                    record.inside_index = moved.index
                    self._save(record)
                    netlink.configure(inside, moved.index, mtu=spec.mtu, up=True)
                    _add_addresses(inside, moved.index, spec.addresses)
                except BaseException:
                    self._undo(record, inside, host)
                    raise
        record.phase = "attached"
        self._save(record)
        log.info("moved %s into %s as %s", name, container, spec.inside)
        return record

    def detach(self, record: NetdevRecord) -> Action:
        """Back to the host under its old name and state; the record goes last. What was
        done: moved back, restored on the host already, or (its namespace gone) what
        reconcile decides."""
        record.phase = "detaching"
        self._save(record)
        try:
            with (
                namespaces.record_ns(self.host, record) as ns_fd,
                netlink.rtnl(ns_fd) as inside,
                namespaces.host_rtnl(self.host) as host,
            ):
                action = self._undo(record, inside, host, quiet=False)
        except ContainerNotFound:
            action = self.reconcile_one(record, alive=False)
            if action is Action.WAIT:
                log.info(
                    "%s left with %s's network namespace; reconcile restores it when the "
                    "kernel returns it",
                    record.host_name,
                    record.container,
                )
            return action
        self._drop(record)
        log.info("moved %s back from %s", record.host_name, record.container)
        return action

    def leaving(self, container: str, remaining: Iterable[str]) -> list[str]:
        """Detach the interfaces none of whose devices are left; their host names."""
        left = set(remaining)
        out = []
        for record in self.records(container):
            if not any(d in left for d in record.with_devices):
                self.detach(record)
                out.append(record.host_name)
        return out

    def release(self, container: str) -> tuple[list[str], list[NetdevRecord]]:
        """Bring back every interface of a container whose devices are gone (it died:
        restarted in its pod, or the pod is gone). A restarted container's namespace
        lives on in its pod's sandbox, and so would the interface, in the tenant's hands
        with no claim behind it: so it moves back now, found through any process still
        in that namespace. Returns what was done ("<host name>: <action>"), and the records still
        out (in transit with a dying namespace, or not provably ours in a live one):
        their devices' claims must stay until these are gone (call under the lock)."""
        back = []
        for record in self.records(container):
            try:
                action = self.detach(record)
            except HotmountError as exc:
                log.warning(
                    "%s of %s stays out, and its claims with it: %s",
                    record.host_name,
                    container,
                    exc.message,
                )
                continue
            if action not in (Action.KEEP, Action.WAIT):
                back.append(f"{record.host_name}: {action}")
        return back, self.records(container)

    def _undo(
        self, record: NetdevRecord, inside: IPRoute, host: IPRoute, quiet: bool = True
    ) -> Action:
        """Wherever it is, give it back its host name and state. Only the interface proven
        ours moves (find_inside): never one the tenant named or addressed like it."""
        try:
            found = self._find_inside(record, inside, host)
            back = None
            if found is not None:
                host_ns = self._host_ns_fd()
                try:
                    netlink.move(inside, found.index, host_ns, record.host_name)
                finally:
                    os.close(host_ns)
                # We just gave it this name on the host, where the tenant has no hand.
                back = next((x for x in netlink.links(host) if x.name == record.host_name), None)
            elif not quiet and find_returned(netlink.links(host), record, set()) is None:
                raise NetdevConflict(
                    f"interface {record.host_name} is not in container {record.container} "
                    "as it was moved in (the same ifindex, kind and host-side peer or "
                    "parent): nothing was moved back; reconcile forgets it once the "
                    "container's network namespace is gone"
                )
            self._restore(record, host, back)
        except HotmountError as exc:
            if not quiet:
                raise
            log.warning("rollback of %s: %s", record.host_name, exc.message)
            return Action.KEEP
        self._drop(record)
        return Action.MOVE_BACK if found is not None else Action.RESTORE

    def _find_inside(self, record: NetdevRecord, inside: IPRoute, host: IPRoute) -> LinkInfo | None:
        host_ns = self._host_ns_fd()
        try:
            host_nsid = netlink.nsid_of(inside, host_ns)
        finally:
            os.close(host_ns)
        return find_inside(netlink.links(inside), record, host_nsid, netlink.links(host))

    def _restore(self, record: NetdevRecord, host: IPRoute, now: LinkInfo | None = None) -> None:
        links = netlink.links(host)
        if now is None:
            primary = primary_indexes(links, carriers(self._traffic(host)))
            now = find_returned(links, record, primary)
        if now is None:
            return
        taken = {link.name for link in links if link.index != now.index}
        steps = restore_plan(record, now, taken)
        netlink.configure(host, now.index, rename=steps.rename, mtu=steps.mtu)
        _add_addresses(host, now.index, steps.addresses)
        netlink.configure(host, now.index, up=steps.up)

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
                if action not in (Action.KEEP, Action.WAIT):
                    done.append(f"{record.host_name}: {action}")
        return done

    def reconcile_one(self, record: NetdevRecord, alive: bool | None) -> Action:
        with contextlib.ExitStack() as stack:
            in_container = None
            ns_fd = None
            if alive is not False:
                try:
                    ns_fd = stack.enter_context(namespaces.record_ns(self.host, record))
                except ContainerNotFound:
                    ns_fd = None
            inside = stack.enter_context(netlink.rtnl(ns_fd)) if ns_fd is not None else None
            host = stack.enter_context(namespaces.host_rtnl(self.host))
            if inside is not None:
                in_container = self._find_inside(record, inside, host)
            links = netlink.links(host)
            primary = primary_indexes(links, carriers(self._traffic(host)))
            on_host = find_returned(links, record, primary)
            nowhere = inside is None and on_host is None
            action = decide(
                record, inside is not None, in_container, on_host, self._unseen_for(record, nowhere)
            )
            if inside is not None and in_container is None and on_host is None:
                # The namespace lives on, and what is in it is not proven ours (the tenant
                # renamed or replaced it): keep the record until the namespace is gone.
                action = Action.KEEP
            if action is Action.MOVE_BACK:
                self._undo(record, inside, host, quiet=False)
            elif action is Action.RESTORE:
                self._restore(record, host)
                self._drop(record)
            elif action is Action.FORGET:
                self._drop(record)
            if action is not Action.KEEP:
                level = logging.DEBUG if action is Action.WAIT else logging.INFO
                log.log(level, "netdev %s of %s: %s", record.host_name, record.container, action)
            return action

    def _unseen_for(self, record: NetdevRecord, nowhere: bool) -> float:
        """Seconds since reconcile first found `record`'s interface nowhere with its
        namespace gone; 0 now, and the clock starts again once it is seen."""
        key = self._path(record.container, record.inside).name
        if not nowhere:
            self._unseen_since.pop(key, None)
            return 0.0
        now = self._clock()
        return now - self._unseen_since.setdefault(key, now)

    def _host_ns_fd(self) -> int:
        """The host's network namespace, as an fd to close (hotmount/netdev/namespaces.py)."""
        return namespaces.host_ns_fd(self.host)


def _add_addresses(ipr: IPRoute, name: str | int, addresses: Iterable[str]) -> None:
    for address in addresses:
        try:
            netlink.configure(ipr, name, add=[address])
        except netlink.NetlinkFailed as exc:
            if getattr(exc.__cause__, "code", None) != _EEXIST:
                raise
