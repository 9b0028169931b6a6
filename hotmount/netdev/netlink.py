"""Netlink through pyroute2: read interfaces, move one between network namespaces, set it up.

The only module that talks RTNL. A container's namespace is opened from its init's
`/proc/<pid>/ns/net` (through the host root) as a file descriptor; a netlink socket
is made inside that namespace (`socket_in`) for pyroute2, and a move names the target namespace
by fd (IFLA_NET_NS_FD) together with the new name (IFLA_IFNAME). The kernel moves
first, under the interface's current name where that is free there (the new name
only stands in where it is not), then renames: so a taken new name fails *after* the
move. Callers find the interface again by ifindex (hotmount/netdev/plan.py).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import ipaddress
import os
import socket
import struct
import threading
from collections.abc import Iterator
from typing import Any

from pyroute2 import IPRoute
from pyroute2.netlink.exceptions import NetlinkError

from hotmount.errors import KernelError
from hotmount.netdev.plan import LinkInfo, NexthopFact, NodeTraffic, RouteFact


class NetlinkFailed(KernelError):
    reason = "NetlinkError"


@contextlib.contextmanager
def rtnl(netns_fd: int | None = None) -> Iterator[IPRoute]:
    """RTNL in this process's namespace, or in the one `netns_fd` names."""
    try:
        sock = None if netns_fd is None else socket_in(netns_fd)
        ipr = IPRoute() if sock is None else IPRoute(use_socket=sock)
    except (OSError, NetlinkError) as exc:
        raise NetlinkFailed(f"opening netlink: {exc}") from exc
    try:
        yield ipr
    finally:
        ipr.close()
        if sock is not None:
            sock.close()


def socket_in(netns_fd: int) -> socket.socket:
    """A NETLINK_ROUTE socket that lives in the namespace `netns_fd` names.

    A socket stays in the namespace it was made in, and setns(CLONE_NEWNET) moves only
    the calling thread: so a short-lived thread enters, makes the socket, and ends.
    (pyroute2's own `netns=` forks a child, which in the agent inherits uvicorn's signal
    wake-up fd: the child's SIGTERM at its end read as the agent's own, and it stopped.)
    """
    made: list[socket.socket] = []
    failed: list[OSError] = []

    def enter_and_make() -> None:
        own = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        try:
            _setns(netns_fd)
            try:
                made.append(socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, _NETLINK_ROUTE))
            finally:
                _setns(own)  # the thread ends anyway; this keeps it tidy
        except OSError as exc:
            failed.append(exc)
        finally:
            os.close(own)

    thread = threading.Thread(target=enter_and_make, name="netns-socket")
    thread.start()
    thread.join()
    if failed:
        raise failed[0]
    return made[0]


_NETLINK_ROUTE = 0
_CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)


def _setns(fd: int) -> None:
    if _libc.setns(fd, _CLONE_NEWNET) != 0:
        error = ctypes.get_errno()
        raise OSError(error, f"setns(CLONE_NEWNET): {os.strerror(error)}")


@contextlib.contextmanager
def failing_as(what: str) -> Iterator[None]:
    try:
        yield
    except NetlinkError as exc:
        raise NetlinkFailed(f"{what}: {os.strerror(exc.code)}") from exc


def _attr(msg: Any, name: str) -> Any:
    return msg.get_attr(name)


def links(ipr: IPRoute) -> list[LinkInfo]:
    out = []
    with failing_as("listing interfaces"):
        for msg in ipr.get_links():
            info = _attr(msg, "IFLA_LINKINFO")
            out.append(
                LinkInfo(
                    index=msg["index"],
                    name=_attr(msg, "IFLA_IFNAME"),
                    mac=_attr(msg, "IFLA_ADDRESS"),
                    mtu=_attr(msg, "IFLA_MTU") or 0,
                    up=bool(msg["flags"] & 1),  # IFF_UP
                    master=_attr(msg, "IFLA_MASTER"),
                    link=_attr(msg, "IFLA_LINK"),
                    kind=info.get_attr("IFLA_INFO_KIND") if info is not None else None,
                    link_netnsid=_attr(msg, "IFLA_LINK_NETNSID"),
                    perm_mac=_attr(msg, "IFLA_PERM_ADDRESS"),
                )
            )
    return out


def nsid_of(ipr: IPRoute, netns_fd: int) -> int | None:
    """The id `ipr`'s namespace gives the namespace `netns_fd` (IFLA_LINK_NETNSID uses it);
    None where it has given none (then no interface there points into it)."""
    with failing_as("reading a namespace id"):
        got = ipr.get_netnsid(fd=netns_fd)
    nsid = (got or {}).get("nsid")
    return None if nsid is None or not 0 <= nsid < 2**31 else nsid  # -1: none (u32)


def traffic(ipr: IPRoute, netns_fd: int | None = None) -> NodeTraffic:
    """What carries traffic in `ipr`'s namespace (`netns_fd` names the same one, for the
    nexthop objects pyroute2 cannot dump): every address, every route of both families
    in every table (multipath hops included), every nexthop object."""
    held = []
    routes = []
    with failing_as("listing addresses"):
        for msg in ipr.get_addr():
            address = _attr(msg, "IFA_LOCAL") or _attr(msg, "IFA_ADDRESS")
            if address is not None:
                held.append((msg["index"], f"{address}/{msg['prefixlen']}"))
    with failing_as("listing routes"):
        for family, anywhere in ((socket.AF_INET, "0.0.0.0"), (socket.AF_INET6, "::")):
            for route in ipr.get_routes(family=family):  # every table (no filter)
                oifs = [_attr(route, "RTA_OIF")]
                oifs += [hop["oif"] for hop in _attr(route, "RTA_MULTIPATH") or []]
                routes.append(
                    RouteFact(
                        destination=f"{_attr(route, 'RTA_DST') or anywhere}/{route['dst_len']}",
                        table=_attr(route, "RTA_TABLE") or route["table"],
                        oifs=tuple(oif for oif in oifs if oif),
                        kernel=route["proto"] == _RTPROT_KERNEL,
                    )
                )
    return NodeTraffic(tuple(held), tuple(routes), tuple(nexthops(netns_fd)))


_RTPROT_KERNEL = 2
_RTM_NEWNEXTHOP, _RTM_GETNEXTHOP = 104, 106
_NLMSG_ERROR, _NLMSG_DONE = 2, 3
_NLM_F_REQUEST, _NLM_F_DUMP = 0x1, 0x300
_NHA_ID, _NHA_GROUP, _NHA_OIF = 1, 2, 5
_NO_NEXTHOPS = (errno.EOPNOTSUPP, errno.EINVAL, errno.EAFNOSUPPORT)  # before Linux 5.3


def nexthops(netns_fd: int | None = None) -> list[NexthopFact]:
    """Every nexthop object (`ip nexthop`): RTM_GETNEXTHOP, which pyroute2 does not speak,
    dumped on a socket of its own; none on a kernel without them."""
    try:
        sock = (
            socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, _NETLINK_ROUTE)
            if netns_fd is None
            else socket_in(netns_fd)
        )
    except OSError as exc:
        raise NetlinkFailed(f"opening netlink: {exc}") from exc
    with sock:
        header = struct.pack("=IHHII", 24, _RTM_GETNEXTHOP, _NLM_F_REQUEST | _NLM_F_DUMP, 1, 0)
        try:
            sock.bind((0, 0))
            sock.send(header + struct.pack("=BBBBI", socket.AF_UNSPEC, 0, 0, 0, 0))
            out: list[NexthopFact] = []
            while True:
                data = sock.recv(1 << 16)
                for kind, body in _messages(data):
                    if kind == _NLMSG_DONE:
                        return out
                    if kind == _NLMSG_ERROR:
                        code = -struct.unpack_from("=i", body)[0]
                        if code == 0:
                            continue
                        if code in _NO_NEXTHOPS:
                            return []
                        raise OSError(code, os.strerror(code))
                    if kind == _RTM_NEWNEXTHOP:
                        out.append(_nexthop(body))
        except OSError as exc:
            raise NetlinkFailed(f"listing nexthop objects: {exc}") from exc


def _messages(data: bytes) -> Iterator[tuple[int, bytes]]:
    offset = 0
    while offset + 16 <= len(data):
        length, kind = struct.unpack_from("=IH", data, offset)
        if length < 16:
            return
        yield kind, data[offset + 16 : offset + length]
        offset += (length + 3) & ~3


def _nexthop(body: bytes) -> NexthopFact:
    """struct nhmsg (8 bytes), then its attributes: NHA_ID, NHA_OIF, NHA_GROUP (an array of
    struct nexthop_grp: u32 id, u8 weight, u8, u16)."""
    nh_id, oif, group = 0, None, ()
    offset = 8
    while offset + 4 <= len(body):
        length, kind = struct.unpack_from("=HH", body, offset)
        if length < 4:
            break
        value = body[offset + 4 : offset + length]
        kind &= 0x3FFF  # NLA_F_NESTED, NLA_F_NET_BYTEORDER
        if kind == _NHA_ID:
            nh_id = struct.unpack("=I", value[:4])[0]
        elif kind == _NHA_OIF:
            oif = struct.unpack("=I", value[:4])[0]
        elif kind == _NHA_GROUP:
            group = tuple(struct.unpack_from("=I", value, i)[0] for i in range(0, len(value), 8))
        offset += (length + 3) & ~3
    return NexthopFact(nh_id, oif, group)


def addresses(ipr: IPRoute, index: int) -> list[str]:
    """Global addresses with their prefix (link-local ones come back by themselves)."""
    out = []
    with failing_as("listing addresses"):
        for msg in ipr.get_addr(index=index):
            address = _attr(msg, "IFA_ADDRESS")
            iface = ipaddress.ip_interface(f"{address}/{msg['prefixlen']}")
            if not iface.ip.is_link_local:
                out.append(str(iface))
    return out


def move(ipr: IPRoute, index: int, target_fd: int, new_name: str) -> None:
    """Take the interface down and move it into the namespace `target_fd`, as `new_name`."""
    with failing_as(f"moving interface {index} to another network namespace as {new_name}"):
        ipr.link("set", index=index, state="down")
        ipr.link("set", index=index, net_ns_fd=target_fd, ifname=new_name)


def configure(
    ipr: IPRoute,
    name: str | int,
    *,
    rename: str | None = None,
    mtu: int | None = None,
    add: tuple[str, ...] | list[str] = (),
    up: bool | None = None,
) -> None:
    """Rename, MTU, addresses, then the state, in the namespace `ipr` works in.

    `name`: an ifindex (what a tenant cannot change under us), or a name on the host."""
    with failing_as(f"configuring interface {name}"):
        found = [name] if isinstance(name, int) else ipr.link_lookup(ifname=name)
        if not found:
            raise NetlinkFailed(f"interface {name} is not there")
        index = found[0]
        if rename is not None:
            ipr.link("set", index=index, state="down")
            ipr.link("set", index=index, ifname=rename)
        if mtu is not None:
            ipr.link("set", index=index, mtu=mtu)
        for text in add:
            iface = ipaddress.ip_interface(text)
            ipr.addr("add", index=index, address=str(iface.ip), prefixlen=iface.network.prefixlen)
        if up is not None:
            ipr.link("set", index=index, state="up" if up else "down")
