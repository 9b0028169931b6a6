"""Network interfaces moved into real runc containers' network namespaces (pyroute2).

Real veth ends and macvlan children on this host; each test makes its own with a
random prefix and deletes whatever is left. runc gives each container its own
network namespace (`runc spec`'s default), which is where the interface goes.
"""

from __future__ import annotations

import ipaddress
import json
import os
import secrets
import subprocess
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from hotmount.engine.core import Engine, EngineConfig
from hotmount.errors import ContainerNotFound, InvalidRequest, KernelError
from hotmount.hostfs import HostRoot
from hotmount.netdev.moves import NetdevNotFound, Netdevs
from hotmount.netdev.plan import (
    RETURN_PATIENCE,
    NetdevConflict,
    NetdevRecord,
    NetdevRefused,
    NetdevSpec,
)
from tests.kernel.conftest import GPU0, GPU1
from tests.support.netdevs import SPARE_TABLE, ip, make_primary
from tests.support.runc import RuncContainer
from tests.support.sysfs import NICS, build_sysfs
from tests.support.waiting import wait_for


def link(name: str, pid: int | None = None) -> dict[str, object] | None:
    shown = ip("-j", "addr", "show", "dev", name, pid=pid)
    return json.loads(shown.stdout)[0] if shown.returncode == 0 else None


@pytest.fixture
def prefix() -> Iterator[str]:
    tag = f"hm{secrets.token_hex(3)}"
    yield tag
    for suffix in ("a", "b", "m"):
        ip("link", "del", f"{tag}{suffix}")


@pytest.fixture
def veth(prefix: str) -> tuple[str, str]:
    a, b = f"{prefix}a", f"{prefix}b"
    subprocess.run(["ip", "link", "add", a, "type", "veth", "peer", "name", b], check=True)
    return a, b


# Where these tests' addresses lie: far from anything a test host uses.
TEST_CIDRS = (ipaddress.ip_network("10.77.0.0/16"), ipaddress.ip_network("fd77::/64"))


def make_engine(
    cdi_dir: Path,
    state_dir: Path,
    allow: tuple[str, ...],
    cidrs: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...] = TEST_CIDRS,
) -> Engine:
    config = EngineConfig(
        cdi_dirs=(str(cdi_dir),),
        state_dir=state_dir,
        use_nvml=False,
        netdev_allow=allow,
        netdev_address_cidrs=cidrs,
    )
    return Engine(config)


@pytest.fixture
def engine(cdi_dir: Path, state_dir: Path, prefix: str) -> Engine:
    return make_engine(cdi_dir, state_dir, (f"{prefix}*",))


@pytest.fixture
def box(make_container) -> RuncContainer:
    return make_container("v1")


def test_a_veth_end_moves_in_renamed_with_mtu_and_addresses_and_back_on_unmount(
    engine: Engine, box: RuncContainer, veth: tuple[str, str]
) -> None:
    a, _ = veth
    before = link(a)
    assert before is not None and before["mtu"] == 1500

    spec = NetdevSpec(name=a, mtu=1400, addresses=["10.77.0.2/24", "fd77::2/64"])
    result = engine.mount(box.id, [GPU0], netdev=spec)

    assert result.netdevs == [a] and [d.key for d in result.mounted] == [GPU0]
    assert link(a) is None  # gone from the host
    inside = link("net1", pid=box.pid)
    assert inside is not None and inside["mtu"] == 1400 and "UP" in inside["flags"]
    addresses = {f"{x['local']}/{x['prefixlen']}" for x in inside["addr_info"]}
    assert {"10.77.0.2/24", "fd77::2/64"} <= addresses
    assert box.open_result("/dev/nvidia0") == "ENXIO"

    done = engine.unmount(box.id, [GPU0])

    assert done.netdevs == [a]
    back = link(a)
    assert back is not None and back["mtu"] == 1500 and back["address"] == before["address"]
    assert "UP" not in back["flags"]  # as it was: down
    assert link("net1", pid=box.pid) is None
    assert engine.netdevs.records() == []


def test_a_macvlan_child_moves_in_and_comes_back_with_its_state(
    engine: Engine, box: RuncContainer, veth: tuple[str, str], prefix: str
) -> None:
    parent, _ = veth
    child = f"{prefix}m"
    subprocess.run(
        ["ip", "link", "add", "link", parent, "name", child, "type", "macvlan", "mode", "bridge"],
        check=True,
    )
    ip("link", "set", child, "mtu", "1300")
    ip("link", "set", child, "up")  # no address: one would make it the node's (refused)

    engine.mount(box.id, [GPU0], netdev=NetdevSpec(name=child, inside="rdma0"))

    inside = link("rdma0", pid=box.pid)
    assert inside is not None and inside["mtu"] == 1300 and "UP" in inside["flags"]
    engine.unmount(box.id)

    back = link(child)
    assert back is not None and back["mtu"] == 1300 and "UP" in back["flags"]


def test_a_killed_container_destroys_the_veth_and_reconcile_forgets_it(
    engine: Engine, box: RuncContainer, veth: tuple[str, str]
) -> None:
    a, b = veth
    engine.mount(box.id, [GPU0], netdev=NetdevSpec(name=a))
    assert len(engine.netdevs.records()) == 1

    box.stop()  # the namespace dies with it: the kernel destroys the veth (and its peer)

    # Later, not at once: cleanup_net runs from a workqueue after the last process is gone.
    wait_for(
        lambda: link(a) is None and link(b) is None,
        f"the kernel to destroy both ends of the veth ({a}, {b}) with the namespace",
        show=lambda: {a: link(a), b: link(b)},
    )
    report = engine.reconcile()
    assert report.netdevs == [f"{a}: forget"]
    assert engine.netdevs.records() == []


def test_a_physical_interface_found_nowhere_is_waited_for_then_forgotten(
    engine: Engine, box: RuncContainer, veth: tuple[str, str], state_dir: Path
) -> None:
    """The kernel returns a NIC when it tears the namespace down, from a workqueue, after
    the last process exits: reconcile must not forget it from a look in between. A veth
    recorded as physical (kind None, as a NIC's record is) stands in for a NIC the kernel
    has not returned yet: after the namespace is gone it is in neither place."""
    a, b = veth
    engine.mount(box.id, [GPU0], netdev=NetdevSpec(name=a))
    [path] = (state_dir / "netdevs").glob("*.json")
    path.write_text(json.dumps({**json.loads(path.read_text()), "kind": None}))
    box.stop()
    wait_for(
        lambda: link(a) is None and link(b) is None,
        f"the kernel to destroy both ends of the veth ({a}, {b}) with the namespace",
    )

    assert engine.reconcile().netdevs == []  # waited for: still recorded
    assert len(engine.netdevs.records()) == 1

    now = [0.0]
    later = Netdevs(engine.host, state_dir, (), clock=lambda: now[0])
    assert later.reconcile(engine.ledger.lock) == [] and len(later.records()) == 1
    now[0] = RETURN_PATIENCE
    assert later.reconcile(engine.ledger.lock) == [f"{a}: forget"]
    assert later.records() == []


def test_an_interface_the_kernel_returns_gets_its_name_and_state_back(
    engine: Engine, box: RuncContainer, veth: tuple[str, str]
) -> None:
    """What the kernel does with a physical NIC when the namespace dies (it returns it to
    the host under the name it had inside), done by hand to a veth: reconcile restores."""
    a, _ = veth
    ip("link", "set", a, "mtu", "1450")
    engine.mount(box.id, [GPU0], netdev=NetdevSpec(name=a, mtu=9000))
    assert ip("link", "set", "net1", "netns", "1", pid=box.pid).returncode == 0
    box.stop()
    assert link("net1") is not None and link(a) is None

    report = engine.reconcile()

    assert report.netdevs == [f"{a}: restore"]
    back = link(a)
    assert back is not None and back["mtu"] == 1450 and link("net1") is None
    assert engine.netdevs.records() == []


def test_a_crash_mid_attach_is_rolled_back_by_reconcile(
    engine: Engine, box: RuncContainer, veth: tuple[str, str]
) -> None:
    """The intent was written, the interface moved, then the agent died."""
    a, b = veth
    shown = link(a)
    assert shown is not None
    engine.netdevs._save(
        NetdevRecord(
            container=box.id,
            init_pid=box.pid,
            init_start_time=int(
                Path(f"/proc/{box.pid}/stat").read_text().split(")")[1].split()[19]
            ),
            phase="attaching",
            host_name=a,
            inside="net1",
            mac=str(shown["address"]),
            mtu=1500,
            up=False,
            kind="veth",
            host_index=int(shown["ifindex"]),
            lower=int(link(b)["ifindex"]),  # type: ignore[index]
            netns_ino=os.stat(f"/proc/{box.pid}/ns/net").st_ino,
        )
    )
    ip("link", "set", a, "netns", str(box.pid), "name", "net1")
    assert link("net1", pid=box.pid) is not None

    report = engine.reconcile()

    assert report.netdevs == [f"{a}: move-back"]
    assert link(a) is not None and link("net1", pid=box.pid) is None
    assert engine.netdevs.records() == []


def default_route_interface() -> str | None:
    routes = json.loads(ip("-j", "route", "show", "default").stdout or "[]")
    return routes[0]["dev"] if routes else None


@pytest.fixture
def fake_primary(veth: tuple[str, str]) -> str:
    return make_primary(veth)  # tests/support/netdevs.py


def test_the_nodes_own_default_route_interface_is_primary(cdi_dir: Path, state_dir: Path) -> None:
    """The check alone, never a mount: the real default-route interface is refused."""
    name = default_route_interface()
    assert name is not None, "this host has no default route: the check has nothing to see"
    engine = make_engine(cdi_dir, state_dir, ("*",))
    with pytest.raises(NetdevRefused, match="primary"):
        engine.netdevs.check(NetdevSpec(), name)


@pytest.mark.parametrize(
    ("allow", "name", "error", "words"),
    [
        (("*",), "primary", NetdevRefused, "primary"),
        (("hm*",), "addressed", NetdevRefused, "address 10.79.0.1/24"),
        (("hm*",), "routed", NetdevRefused, f"route 10.79.0.0/16 in table {SPARE_TABLE}"),
        (("*",), "lo", NetdevRefused, "primary"),
        (("other*",), "veth", NetdevRefused, "allow-list"),
        ((), "veth", NetdevRefused, "off on this node"),
        (("*",), "nosuch0", NetdevNotFound, "not in the host's"),
        (("*",), "a/b", InvalidRequest, "not an interface name"),
    ],
    ids=[
        "spare-table-default-route",
        "allowed-but-addressed",
        "allowed-but-routed",
        "loopback",
        "not-allowed",
        "feature-off",
        "absent",
        "bad-name",
    ],
)
def test_refused_interfaces_change_nothing(
    request: pytest.FixtureRequest,
    cdi_dir: Path,
    state_dir: Path,
    box: RuncContainer,
    veth: tuple[str, str],
    allow: tuple[str, ...],
    name: str,
    error: type[Exception],
    words: str,
) -> None:
    if name == "primary":
        name = request.getfixturevalue("fake_primary")
    if name == "addressed":  # only a connected route and an address: a storage network
        ip("addr", "add", "10.79.0.1/24", "dev", veth[0]).check_returncode()
        name = veth[0]
    if name == "routed":  # no address: a route in another table names it
        for end in veth:
            ip("link", "set", end, "up").check_returncode()
        add = ("route", "add", "10.79.0.0/16", "dev", veth[0], "table", SPARE_TABLE)
        ip(*add).check_returncode()
        name = veth[0]
    name = {"veth": veth[0]}.get(name, name)
    engine = make_engine(cdi_dir, state_dir, allow)
    with pytest.raises(error, match=words):
        engine.netdevs.check(NetdevSpec(), name)

    with pytest.raises(error, match=words):
        engine.mount(box.id, [GPU0], netdev=NetdevSpec(name=name))

    assert "nvidia0" not in box.ls_dev() and engine.ledger.records() == []
    assert engine.netdevs.records() == []
    if name != "nosuch0" and "/" not in name:
        assert link(name) is not None  # still on the host


def test_the_inside_name_must_be_free(
    engine: Engine, box: RuncContainer, veth: tuple[str, str]
) -> None:
    with pytest.raises(Exception, match="already has an lo"):
        engine.mount(box.id, [GPU0], netdev=NetdevSpec(name=veth[0], inside="lo"))
    # The devices this call mounted are rolled back with it; the veth never moved.
    assert "nvidia0" not in box.ls_dev() and engine.ledger.records() == []
    assert link(veth[0]) is not None


def test_a_gone_container_is_refused(
    engine: Engine, box: RuncContainer, veth: tuple[str, str]
) -> None:
    box.stop()
    with pytest.raises(ContainerNotFound):
        engine.mount(box.id, [GPU0], netdev=NetdevSpec(name=veth[0]))
    assert link(veth[0]) is not None


def test_a_container_in_the_hosts_network_namespace_is_refused(
    engine: Engine, veth: tuple[str, str]
) -> None:
    """A hostNetwork pod: "moving" an interface into it would only rename the host's."""
    me = os.getpid()
    start = int(Path(f"/proc/{me}/stat").read_text().rpartition(")")[2].split()[19])
    with pytest.raises(NetdevRefused, match="host's network namespace"):
        engine.netdevs.attach("host-net", me, start, NetdevSpec(name=veth[0]), veth[0], [])
    assert link(veth[0]) is not None and link("net1") is None
    assert engine.netdevs.records() == []


def test_unmount_moves_back_the_real_interface_never_the_tenants_decoy(
    engine: Engine, box: RuncContainer, veth: tuple[str, str]
) -> None:
    """The tenant (NET_ADMIN in its pod) renames net1 away and makes a veth named net1
    with its MAC: the agent must bring back its own, by ifindex and host-side peer."""
    a, b = veth
    mac = str(link(a)["address"])  # type: ignore[index]
    engine.mount(box.id, [GPU0], netdev=NetdevSpec(name=a))
    ip("link", "set", "net1", "name", "real1", pid=box.pid).check_returncode()
    made = ip(
        "link", "add", "net1", "address", mac, "type", "veth", "peer", "name", "decoy", pid=box.pid
    )
    made.check_returncode()

    done = engine.unmount(box.id, [GPU0])

    assert done.netdevs == [a]
    back = link(a)
    assert back is not None and back["link"] == b  # ours: paired with the host's peer
    assert link("real1", pid=box.pid) is None
    assert link("net1", pid=box.pid) is not None and link("decoy", pid=box.pid) is not None
    assert engine.netdevs.records() == []


def test_a_deleted_interface_is_not_replaced_by_a_decoy_on_unmount(
    engine: Engine, box: RuncContainer, veth: tuple[str, str]
) -> None:
    """Ours gone (deleting a veth end takes its host peer too), a decoy in its place:
    unmount moves nothing back and says why; the devices are unmounted all the same."""
    a, b = veth
    mac = str(link(a)["address"])  # type: ignore[index]
    engine.mount(box.id, [GPU0], netdev=NetdevSpec(name=a))
    ip("link", "del", "net1", pid=box.pid).check_returncode()
    ip(
        "link", "add", "net1", "address", mac, "type", "veth", "peer", "name", b, pid=box.pid
    ).check_returncode()

    with pytest.raises(NetdevConflict, match="nothing was moved back"):
        engine.unmount(box.id, [GPU0])

    assert link(a) is None and link(b) is None  # nothing of the tenant's on the host
    assert link("net1", pid=box.pid) is not None
    assert "nvidia0" not in box.ls_dev() and engine.ledger.records() == []


def test_a_namespace_held_after_its_init_died_gets_the_interface_taken_back(
    engine: Engine, box: RuncContainer, veth: tuple[str, str]
) -> None:
    """Its init dead, the namespace held by another process (as a pod's sandbox holds
    it): the devices' records go, so the interface comes back, through that process."""
    a, _ = veth
    engine.mount(box.id, [GPU0], netdev=NetdevSpec(name=a))
    holder = subprocess.Popen(["nsenter", "-t", str(box.pid), "-n", "--", "sleep", "infinity"])
    try:
        wanted = os.stat(f"/proc/{box.pid}/ns/net").st_ino
        wait_for(
            lambda: os.stat(f"/proc/{holder.pid}/ns/net").st_ino == wanted,
            "the holder (nsenter) to enter the container's network namespace",
        )
        box.stop()

        report = engine.reconcile()

        assert report.netdevs == [f"{a}: move-back"] and report.forgotten == [box.id]
        assert link("net1", pid=holder.pid) is None and link(a) is not None
        assert engine.netdevs.records() == [] and engine.ledger.claims() == []
    finally:
        holder.kill()
        holder.wait()


def test_an_interface_left_out_by_an_older_agent_comes_back(
    engine: Engine, box: RuncContainer, veth: tuple[str, str]
) -> None:
    """An agent before this rule forgot a restarted container's record and claims, and
    left its interface in the pod: the next reconcile brings it back."""
    a, _ = veth
    engine.mount(box.id, [GPU0], netdev=NetdevSpec(name=a))
    holder = subprocess.Popen(["nsenter", "-t", str(box.pid), "-n", "--", "sleep", "infinity"])
    try:
        wanted = os.stat(f"/proc/{box.pid}/ns/net").st_ino
        wait_for(
            lambda: os.stat(f"/proc/{holder.pid}/ns/net").st_ino == wanted,
            "the holder (nsenter) to enter the container's network namespace",
        )
        box.stop()
        for claim in engine.ledger.claims():  # what the older agent's reconcile did
            engine.ledger.release(claim.device, claim.owner)
        engine.ledger.delete(box.id)

        assert engine.reconcile().netdevs == [f"{a}: move-back"]
        assert link("net1", pid=holder.pid) is None and link(a) is not None
        assert engine.netdevs.records() == []
    finally:
        holder.kill()
        holder.wait()


def test_an_interface_not_provably_ours_keeps_its_devices_claims_until_it_is_gone(
    engine: Engine, box: RuncContainer, veth: tuple[str, str]
) -> None:
    """The tenant hid ours in a namespace of its own inside the pod: nothing can be moved
    back, so the claims stay while the pod's namespace lives, and go with it."""
    a, b = veth
    engine.mount(box.id, [GPU0], netdev=NetdevSpec(name=a))
    holder = subprocess.Popen(["nsenter", "-t", str(box.pid), "-n", "--", "sleep", "infinity"])
    hidden = subprocess.Popen(["unshare", "-n", "--", "sleep", "infinity"])
    try:
        wanted = os.stat(f"/proc/{box.pid}/ns/net").st_ino
        wait_for(
            lambda: os.stat(f"/proc/{holder.pid}/ns/net").st_ino == wanted,
            "the holder (nsenter) to enter the container's network namespace",
        )
        wait_for(
            lambda: (
                os.stat(f"/proc/{hidden.pid}/ns/net").st_ino != os.stat("/proc/self/ns/net").st_ino
            ),
            "unshare to make its own network namespace",
        )
        ip("link", "set", "net1", "netns", str(hidden.pid), pid=box.pid).check_returncode()
        box.stop()

        assert engine.reconcile().forgotten == []
        [kept] = engine.ledger.records()  # the dead container's, with its claims
        assert [c.device for c in engine.ledger.claims()] == list(kept.devices)
        assert len(engine.netdevs.records()) == 1
    finally:
        holder.kill()
        holder.wait()
        hidden.kill()
        hidden.wait()
    wait_for(
        lambda: link(b) is None,
        "the kernel to destroy the veth (and its host-side peer) with the hidden namespace",
        show=lambda: link(b),
    )
    report = engine.reconcile()
    assert report.forgotten == [box.id] and engine.ledger.claims() == []
    assert engine.netdevs.records() == []


@pytest.fixture
def rdma_engine(
    cdi_dir: Path, state_dir: Path, tmp_path: Path, prefix: str, veth: tuple[str, str]
) -> Engine:
    """mlx5_0's own network interface is the veth end."""
    sys_root = build_sysfs(tmp_path / "sys-root", (replace(NICS[0], netdev=veth[0]),))
    config = EngineConfig(
        cdi_dirs=(str(cdi_dir),),
        state_dir=state_dir,
        use_nvml=False,
        netdev_allow=(f"{prefix}*",),
        sys_root=sys_root,
    )
    return Engine(config)


def test_an_rdma_nics_interface_goes_only_with_that_nic(
    rdma_engine: Engine, box: RuncContainer, veth: tuple[str, str]
) -> None:
    a, _ = veth
    with pytest.raises(NetdevRefused, match="belongs to RDMA device rdma/mlx5_0"):
        rdma_engine.mount(box.id, [GPU1], netdev=NetdevSpec(name=a))
    assert link(a) is not None and rdma_engine.ledger.records() == []

    # Held by this container already (its claim group), or mounted with it: allowed.
    rdma_engine.mount(box.id, [GPU0], rdma=["rdma/mlx5_0"])
    rdma_engine.mount(box.id, [GPU1], netdev=NetdevSpec(name=a))
    assert link("net1", pid=box.pid) is not None
    rdma_engine.unmount(box.id)
    assert link(a) is not None


def test_a_restarted_container_gives_back_the_nics_interface_with_its_claim(
    rdma_engine: Engine, tmp_path: Path, rootfs: Path, veth: tuple[str, str]
) -> None:
    """A pod as the kubelet runs it with runc: a sandbox holds the network namespace, the
    app container joins it. The app restarts: its devices and their claims go, and the
    NIC's interface must go with them, not stay in the pod with no claim behind it (the
    tenant could mount more allow-listed interfaces while the NIC is free for others)."""
    a, _ = veth
    sandbox = RuncContainer(tmp_path, rootfs, "v1")
    running = [sandbox]
    try:
        app = RuncContainer(tmp_path, rootfs, "v1", share_net_with=sandbox)
        running.append(app)
        spec = NetdevSpec(name=a)
        rdma_engine.mount(app.id, [GPU0], rdma=["rdma/mlx5_0"], netdev=spec)
        assert "rdma/mlx5_0" in {c.device for c in rdma_engine.ledger.claims()}
        assert link("net1", pid=sandbox.pid) is not None

        app.stop()  # the kubelet restarts it: a new container in the same sandbox
        running.remove(app)
        restarted = RuncContainer(tmp_path, rootfs, "v1", share_net_with=sandbox)
        running.append(restarted)
        report = rdma_engine.reconcile()

        assert report.forgotten == [app.id] and report.netdevs == [f"{a}: move-back"]
        assert rdma_engine.ledger.claims() == [] and rdma_engine.netdevs.records() == []
        assert link("net1", pid=restarted.pid) is None and link(a) is not None
    finally:
        for container in reversed(running):
            container.stop()


def test_the_hosts_namespace_is_pid_1s_or_kthreadds_never_a_guess(
    engine: Engine, tmp_path: Path
) -> None:
    """Here PID 1 (a sandbox init) refuses its namespace to root: kthreadd's is the
    initial one. With neither to be had, an error: never the agent's own by default."""
    fd = engine.netdevs._host_ns_fd()
    try:
        assert os.fstat(fd).st_ino == os.stat("/proc/2/ns/net").st_ino
    finally:
        os.close(fd)

    fake = tmp_path / "host"
    (fake / "proc" / "2").mkdir(parents=True)
    (fake / "proc" / "1").symlink_to("/proc/1")
    (fake / "proc" / "2" / "stat").write_text("2 (not-kthreadd) S 0 0 0 0 -1 0 0 0")
    netdevs = Netdevs(HostRoot(fake), tmp_path / "state", ())
    try:
        fd = os.open("/proc/1/ns/net", os.O_RDONLY)
    except PermissionError:
        with pytest.raises(KernelError, match="network namespace cannot be opened"):
            netdevs._host_ns_fd()
    else:  # a host whose PID 1 lets root in: its namespace it is
        os.close(fd)
        own = netdevs._host_ns_fd()
        assert os.fstat(own).st_ino == os.stat("/proc/1/ns/net").st_ino
        os.close(own)


def test_unmount_revokes_the_devices_before_the_interface_goes_back(
    engine: Engine, box: RuncContainer, veth: tuple[str, str], prefix: str
) -> None:
    """The interface is the last step: a move back that fails (its host name is taken
    meanwhile) leaves no device behind, and reconcile finishes the move later."""
    a, _ = veth
    engine.mount(box.id, [GPU0], netdev=NetdevSpec(name=a))
    ip("link", "add", a, "type", "veth", "peer", "name", f"{prefix}m").check_returncode()

    with pytest.raises(Exception, match="moving interface"):
        engine.unmount(box.id, [GPU0])

    assert "nvidia0" not in box.ls_dev() and engine.ledger.records() == []
    assert box.open_result("/dev/nvidia0") == "ENOENT"
    # The kernel moved it under its inside name (its own name was free), then the rename
    # failed: on the host as net1, down, its record kept for reconcile.
    assert link("net1", pid=box.pid) is None and len(engine.netdevs.records()) == 1
    ip("link", "del", a).check_returncode()  # the squatter (and its peer) go
    assert engine.reconcile().netdevs == [f"{a}: restore"]
    assert link(a) is not None and engine.netdevs.records() == []


@pytest.mark.parametrize(
    ("cidrs", "address", "words"),
    [
        ((), "10.77.0.2/24", "no --netdev-address-cidr"),
        (TEST_CIDRS, "10.88.0.2/24", "outside the CIDRs"),
        (TEST_CIDRS, "fd88::2/64", "outside the CIDRs"),
        (TEST_CIDRS, "10.77.9.9/24", "held by the node"),
    ],
    ids=["default-none", "outside", "ipv6-outside", "node-held-inside-the-cidr"],
)
def test_an_address_the_operator_did_not_allow_is_refused_and_nothing_moves(
    cdi_dir: Path,
    state_dir: Path,
    prefix: str,
    box: RuncContainer,
    veth: tuple[str, str],
    cidrs: tuple[ipaddress.IPv4Network, ...],
    address: str,
    words: str,
) -> None:
    """A pod would take over a gateway's or a storage server's address: the node holds
    10.77.9.9 here (on the veth's host-side peer), read when the request comes."""
    a, b = veth
    ip("addr", "add", "10.77.9.9/24", "dev", b).check_returncode()
    engine = make_engine(cdi_dir, state_dir, (f"{prefix}*",), cidrs)

    with pytest.raises(NetdevRefused, match=words):
        engine.mount(box.id, [GPU0], netdev=NetdevSpec(name=a, addresses=[address]))

    assert link(a) is not None and link("net1", pid=box.pid) is None
    assert "nvidia0" not in box.ls_dev() and engine.ledger.records() == []
    assert engine.netdevs.records() == []
    # The same interface, an address inside the CIDRs that nobody holds: it moves.
    engine = make_engine(cdi_dir, state_dir, (f"{prefix}*",))
    engine.mount(box.id, [GPU0], netdev=NetdevSpec(name=a, addresses=["10.77.9.10/24"]))
    inside = link("net1", pid=box.pid)
    assert inside is not None
    assert "10.77.9.10" in [x["local"] for x in inside["addr_info"] if x["family"] == "inet"]
