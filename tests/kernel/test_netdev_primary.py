"""What carries the node's traffic, read from a real kernel: a throwaway network namespace
stands in for the host's (its `/proc/1/ns/net` is the namespace's file), so the whole
check (netlink facts, then the pure rule) runs on real interfaces, routes and nexthop
objects without touching the node's own.

This kernel has no dummy, VLAN or bond driver: veth ends stand in for NICs, and a
macvlan (IFLA_LINK, as a VLAN) and a bridge (IFLA_MASTER, as a bond) for the upper and
lower links; the rule reads only those two links, whatever the kind
(tests/unit/test_netdev_plan.py has VLANs and bonds as facts).
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from hotmount.hostfs import HostRoot
from hotmount.netdev.moves import Netdevs
from hotmount.netdev.plan import NetdevRefused, NetdevSpec

Run = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture
def netns() -> Iterator[tuple[str, Run]]:
    """A throwaway network namespace, held by a sleeping process: (its file, `ip` in it).
    Never `ip netns add`: that bind-mounts /run/netns over itself, which hides the netns
    files a node's CNI made there, and its kubelet can then delete no pod (EBUSY)."""
    holder = subprocess.Popen(["unshare", "--net", "sleep", "infinity"])
    path = f"/proc/{holder.pid}/ns/net"
    own = os.readlink("/proc/self/ns/net")
    try:
        for _ in range(500):  # until unshare(2) has run: the file names another namespace
            if os.readlink(path) != own:
                break
            time.sleep(0.01)
        else:
            raise AssertionError("unshare --net did not make a network namespace")

        def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
            done = subprocess.run(
                ["nsenter", f"--net={path}", "ip", *args],
                capture_output=True, text=True, check=False,
            )  # fmt: skip
            if check and done.returncode != 0:
                raise AssertionError(f"ip {' '.join(args)}: {done.stderr}")
            return done

        yield path, ip
    finally:
        holder.kill()
        holder.wait()


def pair(ip: Run, a: str, b: str) -> None:
    """A veth pair, both ends up (IPv6 then gives both link-local addresses and routes)."""
    ip("link", "add", a, "type", "veth", "peer", "name", b)
    ip("link", "set", a, "up")
    ip("link", "set", b, "up")


def as_host(tmp_path: Path, netns_file: str) -> Netdevs:
    """Netdevs whose "host" namespace is the throwaway one, everything allowed."""
    root = tmp_path / "host"
    (root / "proc" / "1" / "ns").mkdir(parents=True)
    (root / "proc" / "1" / "ns" / "net").symlink_to(netns_file)
    return Netdevs(HostRoot(root), tmp_path / "state", ("*",))


def build(ip: Run, case: str) -> str:
    """Make `case` in the namespace; the interface the check is asked about."""
    if case == "clean":
        pair(ip, "clean0", "clean1")
        return "clean0"
    if case == "address":  # the attack: only a connected route and an address
        pair(ip, "addr0", "addr1")
        ip("addr", "add", "10.50.0.1/24", "dev", "addr0")
        return "addr0"
    if case == "ipv6-address":
        pair(ip, "six0", "six1")
        ip("addr", "add", "fd50::1/64", "dev", "six0", "nodad")
        return "six0"
    if case == "table-100":
        pair(ip, "tbl0", "tbl1")
        ip("route", "add", "10.51.0.0/16", "dev", "tbl0", "table", "100")
        return "tbl0"
    if case == "ipv6-table-100":
        pair(ip, "tbl6a", "tbl6b")
        ip("-6", "route", "add", "fd51::/64", "dev", "tbl6a", "table", "100")
        return "tbl6a"
    if case == "nexthop-route":
        pair(ip, "nh0", "nh1")
        ip("nexthop", "add", "id", "70", "dev", "nh0")
        ip("nexthop", "add", "id", "71", "group", "70")
        ip("route", "add", "10.52.0.0/16", "nhid", "71", "table", "100")
        return "nh0"
    if case == "macvlan-over-addressed":
        pair(ip, "par0", "par1")
        ip("addr", "add", "10.53.0.1/24", "dev", "par0")
        ip("link", "add", "link", "par0", "name", "mvl0", "type", "macvlan", "mode", "bridge")
        return "mvl0"
    if case == "under-addressed-macvlan":
        pair(ip, "low0", "low1")
        ip("link", "add", "link", "low0", "name", "mvu0", "type", "macvlan", "mode", "bridge")
        ip("addr", "add", "10.54.0.1/24", "dev", "mvu0")
        return "low0"
    if case == "member-of-addressed-bridge":
        pair(ip, "port0", "port1")
        ip("link", "add", "br9", "type", "bridge")
        ip("link", "set", "port0", "master", "br9")
        ip("addr", "add", "10.55.0.1/24", "dev", "br9")
        return "port0"
    raise AssertionError(case)


REFUSED = {
    "address": "address 10.50.0.1/24",
    "ipv6-address": "address fd50::1/64",
    "table-100": "route 10.51.0.0/16 in table 100",
    "ipv6-table-100": "route fd51::/64 in table 100",
    "nexthop-route": "nexthop object 70",
    "macvlan-over-addressed": "under or over par0",
    "under-addressed-macvlan": "under or over mvu0",
    "member-of-addressed-bridge": "under or over br9",
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_an_interface_that_carries_the_nodes_traffic_is_refused(
    netns: tuple[str, Run], tmp_path: Path, case: str
) -> None:
    name, ip = netns
    netdevs = as_host(tmp_path, name)
    pair(ip, "clean0", "clean1")  # beside it, allowed: the refusal is about `case` only
    asked = build(ip, case)

    with pytest.raises(NetdevRefused, match="carry the node's traffic") as refused:
        netdevs.check(NetdevSpec(), asked)

    assert REFUSED[case] in refused.value.message
    netdevs.check(NetdevSpec(), "clean0")
    assert ip("link", "show", "dev", asked).returncode == 0  # nothing moved


def test_a_clean_interface_is_allowed_with_its_link_local_addresses_and_routes(
    netns: tuple[str, Run], tmp_path: Path
) -> None:
    """Up, it has fe80:: addresses and the kernel's fe80::/64 and ff00::/8 routes, and an
    IPv4 link-local address: none of that is the node's traffic."""
    name, ip = netns
    netdevs = as_host(tmp_path, name)
    asked = build(ip, "clean")
    ip("addr", "add", "169.254.7.7/16", "dev", asked)
    routes = ip("-6", "route", "show", "table", "all", "dev", asked).stdout
    assert "fe80::/64" in routes and "ff00::/8" in routes

    netdevs.check(NetdevSpec(), asked)


def test_the_loopback_is_refused(netns: tuple[str, Run], tmp_path: Path) -> None:
    name, _ = netns
    with pytest.raises(NetdevRefused, match="loopback"):
        as_host(tmp_path, name).check(NetdevSpec(), "lo")
