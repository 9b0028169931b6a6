"""Which interfaces may move, and what reconcile does with each record: pure rules."""

from __future__ import annotations

import ipaddress
from pathlib import Path

import pytest

from hotmount.errors import InvalidRequest
from hotmount.hostfs import HostRoot
from hotmount.netdev.moves import Netdevs
from hotmount.netdev.plan import (
    RETURN_PATIENCE,
    Action,
    LinkInfo,
    NetdevConflict,
    NetdevRecord,
    NetdevRefused,
    NexthopFact,
    NodeTraffic,
    Restore,
    RouteFact,
    carriers,
    check_address_policy,
    check_addresses,
    check_allowed,
    decide,
    find_inside,
    find_returned,
    netns_holder,
    primary_indexes,
    primary_interfaces,
    restore_plan,
)

# A node: bond0 (members eno1, eno2) carries the default route through vlan100 on it;
# br0 holds veth hostA; ens1f0 is the RDMA NIC, with VFs and a macvlan child.
LINKS = [
    LinkInfo(1, "lo"),
    LinkInfo(2, "eno1", master=3),
    LinkInfo(4, "eno2", master=3),
    LinkInfo(3, "bond0", kind="bond"),
    LinkInfo(5, "vlan100", link=3, kind="vlan"),
    LinkInfo(6, "ens1f0"),
    LinkInfo(7, "ens1f0v0"),
    LinkInfo(8, "mv0", link=6, kind="macvlan"),
    LinkInfo(9, "uplink-mv", link=5, kind="macvlan"),
    LinkInfo(10, "hostA", link=11, kind="veth", master=12),
    LinkInfo(12, "br0", kind="bridge"),
]


def test_primary_follows_the_route_down_and_to_the_members_and_up_to_the_children() -> None:
    """vlan100 carries the route; bond0 under it, bond0's members, and the macvlan on
    vlan100 (an upper can take its lower's traffic) are the node's too."""
    primary = primary_interfaces(LINKS, [5])
    assert set(primary) == {"vlan100", "bond0", "eno1", "eno2", "uplink-mv", "lo"}
    assert "route" in primary["vlan100"] and "under or over vlan100" in primary["eno1"]


def test_a_veth_peer_is_not_followed_but_a_master_is() -> None:
    primary = primary_interfaces(LINKS, [10])
    assert "hostA" in primary and "br0" in primary  # br0: hostA is its member
    assert "mv0" not in primary and "ens1f0" not in primary  # peer 11 is not followed


def test_no_route_leaves_lo_only() -> None:
    assert set(primary_interfaces(LINKS, [])) == {"lo"}


def traffic(
    addresses: tuple[tuple[int, str], ...] = (),
    routes: tuple[RouteFact, ...] = (),
    nexthops: tuple[NexthopFact, ...] = (),
) -> NodeTraffic:
    return NodeTraffic(addresses, routes, nexthops)


@pytest.mark.parametrize(
    ("facts", "words"),
    [
        (traffic(addresses=((6, "10.20.0.5/24"),)), "address 10.20.0.5/24"),
        (traffic(addresses=((6, "fd20::5/64"),)), "address fd20::5/64"),
        (traffic(routes=(RouteFact("10.30.0.0/16", 254, (6,), kernel=True),)), "table 254"),
        (traffic(routes=(RouteFact("10.30.0.0/16", 100, (6,)),)), "route 10.30.0.0/16 in table"),
        (traffic(routes=(RouteFact("::/0", 7, (6,)),)), "route default in table 7"),
        (traffic(routes=(RouteFact("0.0.0.0/0", 254, (2, 6)),)), "route default"),
        (traffic(nexthops=(NexthopFact(7, oif=6),)), "nexthop object 7"),
        (
            traffic(
                routes=(RouteFact("10.9.0.0/16", 100, nexthop_id=9),),
                nexthops=(NexthopFact(9, group=(7,)), NexthopFact(7, oif=6)),
            ),
            "nexthop object 7",
        ),
        # An operator's link-local route (a metadata service) is the node's traffic.
        (traffic(routes=(RouteFact("169.254.169.254/32", 254, (6,)),)), "169.254.169.254"),
    ],
    ids=[
        "ipv4-address",
        "ipv6-address",
        "connected-route",
        "other-table",
        "ipv6-default-other-table",
        "multipath-hop",
        "nexthop-object",
        "nhid-group-route",
        "operator-link-local-route",
    ],
)
def test_what_carries_the_nodes_traffic(facts: NodeTraffic, words: str) -> None:
    why = carriers(facts)
    assert 6 in why and words in why[6]
    primary = primary_interfaces(LINKS, why)
    # ens1f0 carries it: its macvlan child goes with it; its VF (no IFLA_LINK) does not.
    assert "ens1f0" in primary and "mv0" in primary and "ens1f0v0" not in primary
    with pytest.raises(NetdevRefused, match="carry the node's traffic"):
        check_allowed("mv0", ("mv*",), primary)


def test_link_local_addresses_and_the_kernels_own_link_routes_are_not_traffic() -> None:
    """What every interface that is up gets by itself: IPv6 fe80::/64 and ff00::/8 (table
    local), an IPv4 link-local address with its kernel route."""
    facts = traffic(
        addresses=((6, "fe80::1/64"), (6, "169.254.3.4/16")),
        routes=(
            RouteFact("fe80::/64", 254, (6,), kernel=True),
            RouteFact("fe80::1/128", 255, (6,), kernel=True),
            RouteFact("ff00::/8", 255, (6,), kernel=True),
            RouteFact("169.254.0.0/16", 254, (6,), kernel=True),
            RouteFact("169.254.3.4/32", 255, (6,), kernel=True),
        ),
    )
    assert carriers(facts) == {}
    check_allowed("ens1f0", ("ens*",), primary_interfaces(LINKS, carriers(facts)))


def test_a_nexthop_group_cycle_ends() -> None:
    facts = traffic(
        routes=(RouteFact("10.9.0.0/16", 100, nexthop_id=1),),
        nexthops=(NexthopFact(1, group=(2,)), NexthopFact(2, group=(1,))),
    )
    assert carriers(facts) == {}


NETWORKS = [ipaddress.ip_network("10.10.0.0/24"), ipaddress.ip_network("fd10::/64")]


@pytest.mark.parametrize(
    ("address", "allowed", "words"),
    [
        ("10.10.0.5/24", [], "no --netdev-address-cidr"),
        ("10.11.0.5/24", NETWORKS, "outside the CIDRs"),
        ("10.10.0.5/16", NETWORKS, "outside the CIDRs"),  # the prefix reaches beyond it
        ("fd11::5/64", NETWORKS, "outside the CIDRs"),
        ("10.10.0.1/24", NETWORKS, "held by the node"),
    ],
    ids=["none-configured", "outside", "prefix-wider", "ipv6-outside", "node-held"],
)
def test_addresses_outside_the_cidrs_or_held_by_the_node_are_refused(
    address: str, allowed: list, words: str
) -> None:
    held = {ipaddress.ip_address("10.10.0.1")}
    with pytest.raises(NetdevRefused, match=words):
        check_address_policy([address], allowed, held)


def test_addresses_inside_the_cidrs_are_allowed() -> None:
    check_address_policy(["10.10.0.5/24", "10.10.0.6/32", "fd10::5/64"], NETWORKS, set())
    check_address_policy([], [], set())  # none asked: nothing to refuse


@pytest.mark.parametrize(
    ("name", "allow", "words"),
    [
        ("ens1f0v0", (), "off on this node"),
        ("vlan100", ("*",), "primary"),
        ("eno1", ("eno*",), "primary"),
        ("lo", ("*",), "primary"),
        ("ens2f0v0", ("ens1f0v*", "mv*"), "not in this node's allow-list"),
    ],
)
def test_refused(name: str, allow: tuple[str, ...], words: str) -> None:
    primary = primary_interfaces(LINKS, [5])
    with pytest.raises(NetdevRefused, match=words):
        check_allowed(name, allow, primary)


def test_allowed_by_glob() -> None:
    primary = primary_interfaces(LINKS, [5])
    for name in ("ens1f0v0", "mv0"):
        check_allowed(name, ("ens1f0v*", "mv*"), primary)


@pytest.mark.parametrize("bad", ["", "a" * 16, "a/b", "a b", "a:1", ".."])
def test_interface_names_are_checked(bad: str) -> None:
    with pytest.raises(InvalidRequest, match="not an interface name"):
        check_allowed(bad, ("*",), set())


def test_addresses() -> None:
    assert check_addresses(["10.0.0.2/24", "fd00::2/64"]) == ["10.0.0.2/24", "fd00::2/64"]
    for bad in ("10.0.0.2", "10.0.0.300/24", "eth0"):
        with pytest.raises(InvalidRequest):
            check_addresses([bad])


def record(phase: str = "attached", **changes: object) -> NetdevRecord:
    base = {
        "container": "c",
        "init_pid": 10,
        "init_start_time": 1,
        "phase": phase,
        "host_name": "ens1f0v0",
        "inside": "net1",
        "mac": "02:00:00:00:00:07",
        "mtu": 9000,
        "up": True,
        "addresses": ["10.1.0.5/16"],
    }
    return NetdevRecord(**{**base, **changes})


HERE = LinkInfo(7, "net1", mac="02:00:00:00:00:07", mtu=1500)


@pytest.mark.parametrize(
    ("phase", "alive", "inside", "host", "action"),
    [
        ("attached", True, HERE, None, Action.KEEP),
        ("attaching", True, HERE, None, Action.MOVE_BACK),
        ("detaching", True, HERE, None, Action.MOVE_BACK),
        ("attached", False, None, HERE, Action.RESTORE),  # a physical VF the kernel returned
        ("attaching", True, None, HERE, Action.RESTORE),  # crashed before the move
        ("detaching", True, None, HERE, Action.RESTORE),  # crashed after the move back
        ("attached", True, None, None, Action.FORGET),  # deleted inside by the tenant
    ],
)
def test_reconcile_decisions(
    phase: str, alive: bool, inside: LinkInfo | None, host: LinkInfo | None, action: Action
) -> None:
    assert decide(record(phase), alive, inside, host) is action


@pytest.mark.parametrize("phase", ["attaching", "attached", "detaching"])
def test_a_virtual_interface_found_nowhere_is_forgotten_at_once(phase: str) -> None:
    """Destroyed with its namespace: nothing of it can come back, however long one waits."""
    veth = record(phase, kind="veth", host_index=7, lower=8)
    assert decide(veth, False, None, None, unseen_for=0.0) is Action.FORGET


def test_a_physical_interface_found_nowhere_is_waited_for_before_it_is_forgotten() -> None:
    """The kernel returns a NIC when it tears the namespace down, from a workqueue, later
    than the namespace's last process exits: one look in between finds it nowhere. (kind
    None: physical, or an old record that does not say.)"""
    nic = record(kind=None, perm_mac="0c:42:a1:00:00:07")
    assert decide(nic, False, None, None, unseen_for=0.0) is Action.WAIT
    assert decide(nic, False, None, None, unseen_for=RETURN_PATIENCE - 1) is Action.WAIT
    assert decide(nic, False, None, None, unseen_for=RETURN_PATIENCE) is Action.FORGET
    assert decide(nic, False, None, HERE, unseen_for=RETURN_PATIENCE - 1) is Action.RESTORE


def test_the_wait_for_a_returned_interface_is_timed_from_the_first_look(tmp_path: Path) -> None:
    """Seconds since it was first found nowhere; found again, the clock starts over."""
    now = [100.0]
    netdevs = Netdevs(HostRoot(tmp_path), tmp_path, ("hm*",), clock=lambda: now[0])
    nic = record()
    assert netdevs._unseen_for(nic, nowhere=True) == 0.0
    now[0] += 25
    assert netdevs._unseen_for(nic, nowhere=True) == 25.0
    assert netdevs._unseen_for(record(inside="net2"), nowhere=True) == 0.0  # its own clock
    assert netdevs._unseen_for(nic, nowhere=False) == 0.0
    now[0] += 5
    assert netdevs._unseen_for(nic, nowhere=True) == 0.0


def test_a_returned_physical_interface_is_found_by_mac_whatever_it_is_called() -> None:
    # After the namespace died the kernel put the VF back as net1, or as dev7 if net1 was
    # taken; a different interface called ens1f0v0 meanwhile has another MAC.
    host = [
        LinkInfo(3, "eth0", mac="02:00:00:00:00:01"),
        LinkInfo(17, "dev7", mac="02:00:00:00:00:07", mtu=1500),
    ]
    found = find_returned(host, record(), primary=set())
    assert found is not None and found.index == 17
    other = [LinkInfo(9, "ens1f0v0", mac="02:00:00:00:00:99")]
    assert find_returned(other, record(), primary=set()) is None


ETH0 = LinkInfo(2, "eth0", mac="02:00:00:00:00:07")


@pytest.mark.parametrize(
    ("host", "changes"),
    [
        # ipvl0 (on eth0, same MAC) went into the pod and died with it: eth0 is left.
        ([ETH0], {"kind": "ipvlan", "host_index": 30, "lower": 2}),
        # A VLAN or a passthru macvlan likewise.
        ([ETH0], {"kind": "vlan", "host_index": 30, "lower": 2}),
        ([ETH0], {"kind": "macvlan", "host_index": 30, "lower": 2}),
        # A physical VF whose MAC the host's primary interface carries too (a bond).
        ([ETH0, LinkInfo(31, "dev7", mac="02:00:00:00:00:07")], {}),
        # A physical one, but the only same-MAC link is primary.
        ([ETH0], {}),
        # A physical one, but the same-MAC link is virtual.
        ([LinkInfo(32, "x", mac="02:00:00:00:00:07", kind="macvlan", link=5)], {}),
        # A physical one whose permanent MAC differs (a NIC given the VF's MAC).
        (
            [LinkInfo(33, "ens9", mac="02:00:00:00:00:07", perm_mac="0c:42:a1:00:00:01")],
            {"perm_mac": "0c:42:a1:00:00:07"},
        ),
    ],
    ids=[
        "ipvlan-parent",
        "vlan-parent",
        "macvlan-parent",
        "mac-shared",
        "primary",
        "virtual",
        "perm-mac",
    ],
)
def test_reconcile_never_restores_an_interface_it_cannot_prove_ours(
    host: list[LinkInfo], changes: dict[str, object]
) -> None:
    primary = primary_indexes(host, [2])
    assert find_returned(host, record(**changes), primary) is None
    assert decide(record(**changes), False, None, None) in (Action.WAIT, Action.FORGET)
    assert decide(record(**changes), False, None, None, RETURN_PATIENCE) is Action.FORGET


def test_an_interface_still_on_the_host_under_its_index_is_found_even_virtual() -> None:
    """A crash before the move (or after the move back): it is where it was."""
    veth = LinkInfo(30, "hm1a", mac="02:00:00:00:00:07", kind="veth", link=31)
    mine = record(kind="veth", host_index=30, lower=31)
    assert find_returned([ETH0, veth], mine, primary={2}) == veth
    assert find_returned([ETH0, veth], mine, primary={2, 30}) is None  # never primary
    assert find_returned([veth], record(kind="veth", host_index=30, lower=99), set()) is None


def test_a_physical_returned_interface_matching_its_permanent_mac_is_restored() -> None:
    nic = LinkInfo(33, "ens9", mac="02:00:00:00:00:07", perm_mac="0c:42:a1:00:00:07")
    assert find_returned([nic], record(perm_mac="0c:42:a1:00:00:07"), set()) == nic


# Inside the pod: net1 (ifindex 5) is our veth whose host peer is ifindex 31; the pod
# numbers the host's namespace 0.
PEER = LinkInfo(31, "hm1b", kind="veth", link=5, link_netnsid=0)
OURS = LinkInfo(5, "net1", mac="02:00:00:00:00:07", kind="veth", link=31, link_netnsid=0)
VETH = record(kind="veth", host_index=30, lower=31, inside_index=5)


def test_inside_the_veth_is_found_by_index_and_peer_whatever_the_tenant_named_it() -> None:
    renamed = LinkInfo(5, "gone", mac="02:00:00:00:00:99", kind="veth", link=31, link_netnsid=0)
    decoy = LinkInfo(9, "net1", mac="02:00:00:00:00:07", kind="veth", link=10)
    assert find_inside([renamed, decoy], VETH, host_nsid=0, host_links=[PEER]) == renamed


@pytest.mark.parametrize(
    "decoy",
    [
        # The tenant deleted ours (the peer goes too) and made a veth pair with its index.
        LinkInfo(5, "net1", mac="02:00:00:00:00:07", kind="veth", link=31),
        # ... whose peer it moved into another namespace of its own.
        LinkInfo(5, "net1", mac="02:00:00:00:00:07", kind="veth", link=31, link_netnsid=3),
        # A macvlan, a dummy: another kind.
        LinkInfo(5, "net1", mac="02:00:00:00:00:07", kind="dummy"),
    ],
    ids=["same-ns-peer", "other-ns-peer", "other-kind"],
)
def test_inside_a_decoy_is_never_ours(decoy: LinkInfo) -> None:
    assert find_inside([decoy], VETH, host_nsid=0, host_links=[PEER]) is None
    # Without the host peer pointing back at it, not even ours is.
    assert find_inside([OURS], VETH, host_nsid=0, host_links=[]) is None


def test_inside_a_physical_interface_is_matched_by_its_permanent_mac() -> None:
    nic = record(host_index=40, inside_index=6, perm_mac="0c:42:a1:00:00:07")
    ours = LinkInfo(6, "net1", mac="02:00:00:00:00:55", perm_mac="0c:42:a1:00:00:07")
    assert find_inside([ours], nic, host_nsid=None, host_links=[]) == ours
    other = LinkInfo(6, "net1", mac="02:00:00:00:00:07", perm_mac="0c:42:a1:00:00:99")
    assert find_inside([other], nic, host_nsid=None, host_links=[]) is None


def test_a_namespace_outlives_its_init_while_a_process_holds_it() -> None:
    """A restarted container: the init died, the sandbox still holds the namespace."""
    mine = record(netns_ino=4026532999)
    assert netns_holder(mine, [(1, 4026531833), (77, 4026532999)]) == 77
    assert netns_holder(mine, [(1, 4026531833)]) is None
    assert netns_holder(record(), [(77, 4026532999)]) is None  # an old record: no inode
    # Found through its holder, the interface is kept; with the namespace gone, waited
    # for (a physical one: the kernel returns it), then forgotten.
    assert decide(mine, True, OURS, None) is Action.KEEP
    assert decide(mine, False, None, None) is Action.WAIT
    assert decide(mine, False, None, None, RETURN_PATIENCE) is Action.FORGET


def test_restore_plan_renames_and_restores_mtu_state_and_addresses() -> None:
    steps = restore_plan(record(), LinkInfo(7, "dev7", mac="x", mtu=1500), taken={"eth0"})
    assert steps == Restore(rename="ens1f0v0", mtu=9000, up=True, addresses=("10.1.0.5/16",))
    same = restore_plan(record(), LinkInfo(7, "ens1f0v0", mtu=9000), taken=set())
    assert same.rename is None and same.mtu is None


def test_restore_refuses_to_take_a_name_someone_else_has_now() -> None:
    with pytest.raises(NetdevConflict, match="another interface is named ens1f0v0"):
        restore_plan(record(), LinkInfo(7, "dev7", mtu=1500), taken={"ens1f0v0"})


def test_the_link_moved_is_the_one_checked_in_the_same_listing(tmp_path: Path) -> None:
    """Between two listings a name can pass from an allowed interface to a primary one
    (rename the uplink `hm1a`): attach checks and picks from one listing, by ifindex."""
    netdevs = Netdevs(HostRoot(tmp_path), tmp_path, ("hm*",))
    now = [LinkInfo(1, "lo"), LinkInfo(2, "hm1a", mac="02:fc:00:00:00:01")]
    with pytest.raises(NetdevRefused, match="primary"):
        netdevs._allowed_link(now, {2}, "hm1a")
    before = [LinkInfo(1, "lo"), LinkInfo(2, "eth0"), LinkInfo(7, "hm1a", kind="veth", link=8)]
    assert netdevs._allowed_link(before, {2}, "hm1a").index == 7
