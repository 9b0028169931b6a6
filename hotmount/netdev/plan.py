"""Network interfaces moved into a container: what may move, and what reconcile does. Pure.

An interface moved out of the host's network namespace is gone from the node:
move the default-route interface and the node is off the network; move a storage or
cluster interface that only has connected routes and the node loses that network.
So the agent moves only what its operator allowed (`--netdev-allow`, names or globs;
empty: the feature is off), and never a *primary* interface, one that carries the
node's traffic (`carriers`, from `NodeTraffic`): a host address other than a
link-local one, a route in any table of either family (the kernel's own link-local
and multicast routes aside), a nexthop object; nor one linked to such an interface
through the upper/lower graph (IFLA_LINK: a VLAN, macvlan or ipvlan and its parent;
IFLA_MASTER: a bond, bridge or team and its members), followed both ways and
transitively: moving a lower takes its uppers with it (the kernel deletes them), a
member leaves its master, and an upper can take its lower's traffic (a passthru
macvlan, an ipvlan). A veth's peer is not followed: it is a link of its own.
`lo` never moves.

The agent sets addresses on a moved interface only inside the CIDRs its operator
names (`--netdev-address-cidr`; none: no addresses), and never one the node holds
(`check_address_policy`): else a pod could take over a gateway's or a storage
server's address on the node's network.

The move is recorded with intent before it happens (`phase`), so that after a
crash reconcile finds where the interface is and finishes the job:

| phase     | found in the container | found on the host          | found nowhere |
|-----------|------------------------|----------------------------|---------------|
| attaching | move it back (rollback)| restore name and state     | forget it     |
| attached  | keep (netns alive)     | restore name and state     | forget it     |
| detaching | move it back (forward) | restore name and state     | forget it     |

"Found nowhere" is never decided from one look while the namespace dies: the kernel
tears a network namespace down later, from a workqueue (`cleanup_net`), after its last
process is gone. Until then a physical interface is in neither place, and forgetting it
then would leave the NIC to come back unrestored. So a physical one (or one whose kind
an old record does not say) found nowhere after its namespace is gone is waited for
(`Action.WAIT`) for `RETURN_PATIENCE` seconds from the first such look, and only then
forgotten. A virtual one is destroyed with the namespace, never returned: forgotten at
once, since nothing of it can come back.

When the container's network namespace dies the kernel destroys a virtual
interface (veth, macvlan) and returns a physical one (a NIC, an SR-IOV VF) to
the host under whatever name is free. Names and MACs are no proof of identity:
the tenant (NET_ADMIN in its pod) picks names and MACs inside, and on the host
an ipvlan, VLAN or passthru macvlan shares its parent's MAC. So an interface is
ours only by what neither side can forge (`find_inside`, `find_returned`):
its ifindex, kind and lower device as recorded at the move, a veth's host-side
peer, a NIC's permanent MAC; a primary interface is never one.
"""

from __future__ import annotations

import fnmatch
import ipaddress
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Literal

from pydantic import BaseModel, Field

from hotmount.errors import Conflict, InvalidRequest

DEFAULT_INSIDE_NAME = "net1"
_IFNAME = re.compile(r"^[A-Za-z0-9_.-]{1,15}$")  # IFNAMSIZ 16 with its NUL; no '/', ':'


class NetdevRefused(InvalidRequest):
    """The interface may not move: not allowed, primary, or the feature is off."""

    reason = "NetdevRefused"


class NetdevConflict(Conflict):
    reason = "NetdevConflict"


def check_name(name: str, what: str = "interface name") -> str:
    if not _IFNAME.match(name) or name in (".", ".."):
        raise InvalidRequest(f"{what} {name!r} is not an interface name (1-15 of A-Za-z0-9_.-)")
    return name


@dataclass(frozen=True)
class LinkInfo:
    """One interface as the kernel shows it (RTM_NEWLINK)."""

    index: int
    name: str
    mac: str | None = None
    mtu: int = 1500
    up: bool = False
    master: int | None = None  # IFLA_MASTER: the bridge/bond it is enslaved to
    link: int | None = None  # IFLA_LINK: what it sits on (VLAN, macvlan parent; a veth's peer)
    kind: str | None = None  # IFLA_INFO_KIND: veth, macvlan, ... (None: a physical device)
    link_netnsid: int | None = None  # IFLA_LINK_NETNSID: `link` is in that other namespace
    perm_mac: str | None = None  # IFLA_PERM_ADDRESS: the NIC's burnt-in MAC, where known


# Networks whose kernel-made routes and addresses are no sign of the node's traffic: an
# interface that is up gets them by itself (IPv6 fe80::/64, ff00::/8 in table local).
LINK_LOCAL = (ipaddress.ip_network("169.254.0.0/16"), ipaddress.ip_network("fe80::/10"))
_MULTICAST = (ipaddress.ip_network("224.0.0.0/4"), ipaddress.ip_network("ff00::/8"))


@dataclass(frozen=True)
class RouteFact:
    """One route (RTM_NEWROUTE): the interfaces it leaves by, as the kernel shows them."""

    destination: str  # "10.9.0.0/16", "default" as "0.0.0.0/0"
    table: int
    oifs: tuple[int, ...] = ()  # RTA_OIF and each multipath hop's
    nexthop_id: int | None = None  # RTA_NH_ID: a route through a nexthop object
    kernel: bool = False  # proto kernel: made by the kernel for an address or a link


@dataclass(frozen=True)
class NexthopFact:
    """One nexthop object (`ip nexthop`): its device, or the objects of its group."""

    id: int
    oif: int | None = None
    group: tuple[int, ...] = ()


@dataclass(frozen=True)
class NodeTraffic:
    """What carries the node's traffic in the host's namespace, read in one go."""

    addresses: tuple[tuple[int, str], ...] = ()  # (ifindex, "10.0.0.5/24")
    routes: tuple[RouteFact, ...] = ()
    nexthops: tuple[NexthopFact, ...] = ()

    def held_addresses(self) -> set[ipaddress.IPv4Address | ipaddress.IPv6Address]:
        """Every address the node holds, on any interface (link-local ones too)."""
        return {ipaddress.ip_interface(text).ip for _, text in self.addresses}


def _within(
    network: ipaddress.IPv4Network | ipaddress.IPv6Network,
    nets: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...],
) -> bool:
    # typeshed's subnet_of takes only its own family; the version check makes them one.
    return any(
        network.version == net.version and network.subnet_of(net)  # type: ignore[arg-type]
        for net in nets
    )


def carriers(traffic: NodeTraffic) -> dict[int, str]:
    """The interfaces that carry the node's traffic themselves, each with why (by ifindex)."""
    why: dict[int, str] = {}
    for index, text in traffic.addresses:
        if not _within(ipaddress.ip_interface(text).network, LINK_LOCAL):
            why.setdefault(index, f"it holds the node's address {text}")
    nexthops = {nh.id: nh for nh in traffic.nexthops}
    for nh in traffic.nexthops:
        if nh.oif is not None:
            why.setdefault(nh.oif, f"nexthop object {nh.id} uses it")
    for route in traffic.routes:
        destination = ipaddress.ip_network(route.destination, strict=False)
        if route.kernel and _within(destination, LINK_LOCAL + _MULTICAST):
            continue
        shown = "default" if destination.prefixlen == 0 else str(destination)
        reason = f"route {shown} in table {route.table} uses it"
        for oif in (*route.oifs, *_nexthop_oifs(route.nexthop_id, nexthops)):
            why.setdefault(oif, reason)
    return why


def _nexthop_oifs(nexthop_id: int | None, nexthops: dict[int, NexthopFact]) -> list[int]:
    """The devices a nexthop object leads to, through its groups (cycle-safe)."""
    out, seen, todo = [], set(), [nexthop_id] if nexthop_id is not None else []
    while todo:
        nh = nexthops.get(todo.pop())
        if nh is None or nh.id in seen:
            continue
        seen.add(nh.id)
        if nh.oif is not None:
            out.append(nh.oif)
        todo += nh.group
    return out


def primary_reasons(
    links: Iterable[LinkInfo], carrying: Mapping[int, str] | Iterable[int]
) -> dict[int, str]:
    """The node's own interfaces, by ifindex (a name can change between two listings, an
    index not), each with why: those `carrying` the node's traffic (see `carriers`), all
    that is linked to one through IFLA_LINK or IFLA_MASTER in either direction, and
    loopback."""
    links = list(links)
    by_index = {link.index: link for link in links}
    if not isinstance(carrying, Mapping):
        carrying = {index: "a route uses it" for index in carrying}
    neighbours: dict[int, set[int]] = {link.index: set() for link in links}
    for link in links:
        # A veth's `link` is its peer, not what it sits on; one in another namespace
        # (IFLA_LINK_NETNSID) numbers an interface there.
        lower = None if link.kind == "veth" or link.link_netnsid is not None else link.link
        for other in (lower, link.master):
            if other is not None and other in by_index and other != link.index:
                neighbours[link.index].add(other)
                neighbours[other].add(link.index)
    primary: dict[int, str] = {}
    for start, reason in carrying.items():
        if start not in by_index or start in primary:
            continue
        primary[start] = reason
        todo = [start]
        while todo:
            for near in neighbours[todo.pop()]:
                if near not in primary:
                    name = by_index[start].name
                    primary[near] = f"it sits under or over {name}, which carries it: {reason}"
                    todo.append(near)
    for link in links:
        if link.name == "lo":
            primary[link.index] = "it is the loopback"
    return primary


def primary_interfaces(
    links: Iterable[LinkInfo], carrying: Mapping[int, str] | Iterable[int]
) -> dict[str, str]:
    """The node's own interfaces' names, each with why: see `primary_reasons`."""
    links = list(links)
    by_index = {link.index: link for link in links}
    reasons = primary_reasons(links, carrying)
    return {"lo": "it is the loopback"} | {by_index[i].name: why for i, why in reasons.items()}


def primary_indexes(
    links: Iterable[LinkInfo], carrying: Mapping[int, str] | Iterable[int]
) -> set[int]:
    return set(primary_reasons(links, carrying))


def check_allowed(name: str, allow: Iterable[str], primary: Mapping[str, str] | set[str]) -> None:
    """Refuse, with the reason, an interface the agent must not move."""
    allow = list(allow)
    check_name(name)
    if not allow:
        raise NetdevRefused(
            "moving network interfaces is off on this node (the agent has no --netdev-allow)"
        )
    if name in primary:
        why = primary[name] if isinstance(primary, Mapping) else "it carries the node's traffic"
        raise NetdevRefused(
            f"interface {name} is one of the node's primary interfaces, which carry the "
            f"node's traffic ({why}); it is never moved"
        )
    if not any(fnmatch.fnmatchcase(name, pattern) for pattern in allow):
        raise NetdevRefused(
            f"interface {name} is not in this node's allow-list (--netdev-allow {' '.join(allow)})"
        )


Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def check_address_policy(
    addresses: Iterable[str],
    allowed: Iterable[Network],
    held: set[ipaddress.IPv4Address | ipaddress.IPv6Address],
) -> None:
    """Each requested address must lie, with its prefix, inside a CIDR the operator named
    (`--netdev-address-cidr`; none: no address at all) and be none the node holds."""
    allowed = list(allowed)
    for text in addresses:
        iface = ipaddress.ip_interface(text)
        if not allowed:
            raise NetdevRefused(
                f"address {text} refused: this node sets no addresses on moved interfaces "
                "(the agent has no --netdev-address-cidr)"
            )
        if not _within(iface.network, tuple(allowed)):
            raise NetdevRefused(
                f"address {text} is outside the CIDRs this node allows "
                f"(--netdev-address-cidr {' '.join(str(n) for n in allowed)})"
            )
        if iface.ip in held:
            raise NetdevRefused(f"address {iface.ip} is held by the node itself: refused")


def check_addresses(addresses: Iterable[str]) -> list[str]:
    out = []
    for text in addresses:
        try:
            iface = ipaddress.ip_interface(text)
        except ValueError as exc:
            raise InvalidRequest(f"address {text!r} is not an address with a prefix") from exc
        if "/" not in text:
            raise InvalidRequest(f"address {text!r} needs a prefix length (10.0.0.2/24)")
        out.append(str(iface))
    return out


class NetdevSpec(BaseModel):
    """What a mount asks for: `name` on the host (None: the RDMA NIC's own interface)."""

    name: str | None = None
    inside: str = DEFAULT_INSIDE_NAME
    mtu: int | None = Field(default=None, ge=68, le=65535)
    addresses: list[str] = Field(default_factory=list)


class NetdevRecord(BaseModel):
    """One interface in one container, as the ledger keeps it (hotmount/netdev/moves.py)."""

    container: str
    init_pid: int
    init_start_time: int
    phase: Literal["attaching", "attached", "detaching"]
    host_name: str  # its name before the move, and after
    inside: str
    mac: str | None
    mtu: int  # before the move
    up: bool  # before the move
    addresses: list[str] = Field(default_factory=list)  # before the move (the move drops them)
    with_devices: list[str] = Field(default_factory=list)  # it leaves with the last of these
    # What identifies it, recorded at the move (None in records written before these):
    kind: str | None = None  # IFLA_INFO_KIND on the host; None: physical
    perm_mac: str | None = None  # IFLA_PERM_ADDRESS, where the kernel gives one
    host_index: int | None = None  # its ifindex on the host before the move
    lower: int | None = None  # host ifindex of its veth peer, or of what it sits on
    inside_index: int | None = None  # its ifindex in the container, right after the move
    netns_ino: int | None = None  # the container's netns inode (it outlives a restart)


# How long a physical interface found nowhere after its namespace is gone is waited for:
# the kernel returns it when it tears the namespace down, which a busy host's workqueue
# can put off for seconds. Past this it is taken to be gone (unplugged, a VF destroyed).
RETURN_PATIENCE = 60.0


class Action(StrEnum):
    KEEP = "keep"
    MOVE_BACK = "move-back"  # from the container to the host, then restore
    RESTORE = "restore"  # on the host already: name, MTU, state, addresses
    WAIT = "wait"  # a physical one in neither place yet: the kernel has not returned it
    FORGET = "forget"  # gone: destroyed with the namespace


def find_inside(
    links: Iterable[LinkInfo],
    record: NetdevRecord,
    host_nsid: int | None,
    host_links: Iterable[LinkInfo],
) -> LinkInfo | None:
    """Our interface in the container's namespace, proven by what the tenant cannot forge.

    Never by name or MAC (the tenant sets both). A virtual one sits on (or, a veth, is
    paired with) the recorded host interface: its lower must be that ifindex *in the
    host's namespace* (`host_nsid`, the host as the container numbers it), and a veth's
    host-side peer must point back at it. A physical one must be physical (the tenant
    cannot make one) and keep its permanent MAC. With `inside_index` recorded, only that
    ifindex counts. None when nothing, or more than one thing, qualifies.
    """
    host_by_index = {link.index: link for link in host_links}
    found = []
    for link in links:
        if record.inside_index is not None and link.index != record.inside_index:
            continue
        if link.kind != record.kind or link.name == "lo":
            continue
        if record.kind is None:
            if record.perm_mac and link.perm_mac and link.perm_mac != record.perm_mac:
                continue
            if not (record.perm_mac and link.perm_mac) and link.mac != record.mac:
                continue
        else:
            if record.lower is None or link.link != record.lower:
                continue
            if host_nsid is None or link.link_netnsid != host_nsid:
                continue
            if record.kind == "veth":
                peer = host_by_index.get(record.lower)
                if peer is None or peer.kind != "veth" or peer.link != link.index:
                    continue
        found.append(link)
    return found[0] if len(found) == 1 else None


def find_returned(
    links: Iterable[LinkInfo], record: NetdevRecord, primary: set[int]
) -> LinkInfo | None:
    """Our interface back on the host, or None (then the record is forgotten).

    Never a primary interface. The interface itself where it still has its recorded
    host ifindex, kind and lower (it never left, or came back by our hand or the
    kernel's with its index). Else only a physical one the kernel returned: of the
    recorded MAC, which no other interface on the host shares (an ipvlan's, VLAN's or
    passthru macvlan's parent has its child's MAC), and of the recorded permanent MAC
    where the kernel gives one. A virtual one is destroyed with the namespace, never
    returned: a same-MAC interface on the host is something else.
    """
    links = list(links)
    mine = [link for link in links if link.index not in primary and link.name != "lo"]
    if record.host_index is not None:
        for link in mine:
            same = link.index == record.host_index and link.kind == record.kind
            if same and link.link == record.lower and link.mac == record.mac:
                return link
    if record.kind is not None or not record.mac:
        return None
    same_mac = [link for link in links if link.mac == record.mac]
    if len(same_mac) != 1 or same_mac[0] not in mine or same_mac[0].kind is not None:
        return None
    [link] = same_mac
    if record.perm_mac and link.perm_mac and record.perm_mac != link.perm_mac:
        return None
    return link


def decide(
    record: NetdevRecord,
    alive: bool,
    in_container: LinkInfo | None,
    on_host: LinkInfo | None,
    unseen_for: float = 0.0,
) -> Action:
    """What reconcile does with one record (see the module's table). `unseen_for`: the
    seconds since reconcile first found it nowhere with its namespace gone (0 the first
    time)."""
    if alive and in_container is not None:
        return Action.KEEP if record.phase == "attached" else Action.MOVE_BACK
    if on_host is not None:
        return Action.RESTORE
    if not alive and record.kind is None and unseen_for < RETURN_PATIENCE:
        return Action.WAIT
    return Action.FORGET


def netns_holder(record: NetdevRecord, inodes: Iterable[tuple[int, int]]) -> int | None:
    """A process still in the record's network namespace, given (PID, netns inode) pairs:
    the namespace outlives a dead init while one holds it (a pod's sandbox, whose
    container restarts), and so does the interface in it."""
    if record.netns_ino is None:
        return None
    return next((pid for pid, ino in inodes if ino == record.netns_ino), None)


@dataclass(frozen=True)
class Restore:
    """The steps that give a returned interface back its name and state, in order."""

    rename: str | None
    mtu: int | None
    up: bool
    addresses: tuple[str, ...]


def restore_plan(record: NetdevRecord, now: LinkInfo, taken: set[str]) -> Restore:
    """From how it is now to how it was; its old name must be free (else a conflict)."""
    rename = None
    if now.name != record.host_name:
        if record.host_name in taken:
            raise NetdevConflict(
                f"interface {now.name} (was {record.host_name}) came back, but another "
                f"interface is named {record.host_name} now"
            )
        rename = record.host_name
    mtu = record.mtu if now.mtu != record.mtu else None
    return Restore(rename, mtu, record.up, tuple(record.addresses))
