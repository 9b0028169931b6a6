"""Which interfaces may move, and what reconcile does with each record: pure rules."""

from __future__ import annotations

import pytest

from hotmount.errors import InvalidRequest
from hotmount.netdev_plan import (
    Action,
    LinkInfo,
    NetdevConflict,
    NetdevRecord,
    NetdevRefused,
    Restore,
    check_addresses,
    check_allowed,
    decide,
    find,
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


def test_primary_follows_the_route_down_and_to_the_members() -> None:
    primary = primary_interfaces(LINKS, default_oifs=[5])
    assert primary == {"vlan100", "bond0", "eno1", "eno2", "lo"}


def test_a_child_of_a_primary_interface_is_not_primary_and_a_veth_peer_is_not() -> None:
    primary = primary_interfaces(LINKS, default_oifs=[5, 10])
    assert "uplink-mv" not in primary and "mv0" not in primary
    assert "hostA" in primary and "br0" not in primary  # peer 11 is not followed


def test_no_default_route_leaves_lo_only() -> None:
    assert primary_interfaces(LINKS, default_oifs=[]) == {"lo"}


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
    primary = primary_interfaces(LINKS, default_oifs=[5])
    with pytest.raises(NetdevRefused, match=words):
        check_allowed(name, allow, primary)


def test_allowed_by_glob() -> None:
    primary = primary_interfaces(LINKS, default_oifs=[5])
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
        ("attached", False, None, None, Action.FORGET),  # a virtual one, destroyed
        ("attached", True, None, None, Action.FORGET),  # deleted inside by the tenant
    ],
)
def test_reconcile_decisions(
    phase: str, alive: bool, inside: LinkInfo | None, host: LinkInfo | None, action: Action
) -> None:
    assert decide(record(phase), alive, inside, host) is action


def test_a_returned_physical_interface_is_found_by_mac_whatever_it_is_called() -> None:
    # After the namespace died the kernel put the VF back as net1, or as dev7 if net1 was
    # taken; a different interface called ens1f0v0 meanwhile has another MAC.
    host = [
        LinkInfo(3, "eth0", mac="02:00:00:00:00:01"),
        LinkInfo(7, "dev7", mac="02:00:00:00:00:07", mtu=1500),
    ]
    found = find(host, record(), "ens1f0v0")
    assert found is not None and found.index == 7
    assert find([LinkInfo(9, "ens1f0v0", mac="02:00:00:00:00:99")], record(), "ens1f0v0") is None


def test_restore_plan_renames_and_restores_mtu_state_and_addresses() -> None:
    steps = restore_plan(record(), LinkInfo(7, "dev7", mac="x", mtu=1500), taken={"eth0"})
    assert steps == Restore(rename="ens1f0v0", mtu=9000, up=True, addresses=("10.1.0.5/16",))
    same = restore_plan(record(), LinkInfo(7, "ens1f0v0", mtu=9000), taken=set())
    assert same.rename is None and same.mtu is None


def test_restore_refuses_to_take_a_name_someone_else_has_now() -> None:
    with pytest.raises(NetdevConflict, match="another interface is named ens1f0v0"):
        restore_plan(record(), LinkInfo(7, "dev7", mtu=1500), taken={"ens1f0v0"})
