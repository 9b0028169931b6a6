"""RDMA devices in the inventory: read from a fixture sysfs and CDI, placed on the PCIe tree."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent import rdma_resources
from hotmount.devices.inventory import Inventory
from hotmount.devices.model import DeviceKind, DeviceNode
from hotmount.devices.topology import pci_address
from hotmount.errors import DeviceNotFound, InvalidDeviceRef
from hotmount.hostfs import HostRoot
from hotmount.state import claims
from tests.support.sysfs import (
    NICS,
    RDMA_CM,
    UVERBS_MAJOR,
    FixtureNic,
    add_char_device,
    add_nic,
    build_sysfs,
)
from tests.unit.hosttree import BY_INDEX, build_host

CM = DeviceNode("/dev/infiniband/rdma_cm", *RDMA_CM)


def load(root: Path, cdi_dirs: tuple[str, ...] = ()) -> Inventory:
    return Inventory.load(HostRoot(root), cdi_dirs, use_nvml=False)


@pytest.fixture
def host(tmp_path: Path) -> Path:
    return build_sysfs(build_host(tmp_path))


@pytest.fixture
def inventory(host: Path) -> Inventory:
    return load(host)


def test_every_verbs_device_is_inventoried_with_its_sysfs_numbers(inventory: Inventory) -> None:
    nics = {d.key: d for d in inventory.devices if d.kind is DeviceKind.RDMA}
    assert sorted(nics) == ["rdma/mlx5_0", "rdma/mlx5_1", "rdma/mlx5_2"]
    first = nics["rdma/mlx5_0"]
    assert first.nodes == (DeviceNode("/dev/infiniband/uverbs0", UVERBS_MAJOR, 192),)
    assert first.shared_nodes == (CM,)  # rdma_cm goes with any RDMA mount
    assert first.pci_bus_id == "0000:19:00.0" and first.numa_node == 0
    assert first.netdevs == ("ens1f0",)
    assert inventory.resolve("rdma/uverbs1").key == "rdma/mlx5_1"


def test_rdma_names_are_refused_in_any_other_form(inventory: Inventory) -> None:
    for bad in ("rdma/../../dev/sda", "/dev/infiniband/uverbs0", "231:192", "rdma/"):
        with pytest.raises(InvalidDeviceRef):
            inventory.resolve(bad)
    with pytest.raises(DeviceNotFound):
        inventory.resolve("rdma/mlx5_9")


def test_nearest_nic_follows_switch_then_host_bridge_then_numa(inventory: Inventory) -> None:
    gpu = {i: inventory.resolve(str(i)) for i in BY_INDEX}
    assert inventory.nearest_rdma(gpu[0]).key == "rdma/mlx5_0"  # same PCIe switch
    assert inventory.nearest_rdma(gpu[1]).key == "rdma/mlx5_0"  # same host bridge
    # Same NUMA node (mlx5_1), though mlx5_2's host bridge sorts nearer by bus number.
    assert inventory.nearest_rdma(gpu[2]).key == "rdma/mlx5_1"


def test_a_mig_instance_uses_its_parent_gpus_place(inventory: Inventory) -> None:
    mig = next(d for d in inventory.devices if d.kind is DeviceKind.MIG)
    parent = inventory.resolve(mig.parent or "")
    assert inventory.nearest_rdma(mig) == inventory.nearest_rdma(parent)


def test_nearest_gpus_per_nic(inventory: Inventory) -> None:
    picked = {k: sorted(g.index for g in v) for k, v in inventory.nearest_gpus().items()}
    assert picked == {"rdma/mlx5_0": [0, 1], "rdma/mlx5_1": [2], "rdma/mlx5_2": []}


def test_no_rdma_and_unknown_place_are_clear_errors(tmp_path: Path) -> None:
    bare = load(build_host(tmp_path / "a"))
    with pytest.raises(DeviceNotFound, match="no RDMA device"):
        bare.nearest_rdma(bare.resolve("0"))
    only_nics = build_sysfs(build_host(tmp_path / "b"))
    # The GPU's sysfs entry is gone: its place is unknown, so nothing is "nearest".
    (only_nics / "sys/bus/pci/devices/0000:18:00.0").unlink()
    inv = load(only_nics)
    with pytest.raises(InvalidDeviceRef, match="name the RDMA device"):
        inv.nearest_rdma(inv.resolve("0"))


def test_cdi_rdma_devices_count_and_get_rdma_cm_and_a_place(host: Path) -> None:
    # A vendor-neutral spec: one device the same as sysfs' mlx5_0 (folds into it), one
    # that sysfs does not list as a verbs device but whose node sysfs places on the tree.
    add_char_device(host, UVERBS_MAJOR, 200, "0000:86:00.0")
    spec_dir = host / "etc/cdi"
    spec_dir.mkdir(parents=True)
    (spec_dir / "rdma.yaml").write_text(
        "cdiVersion: 0.6.0\nkind: example.com/rdma\ndevices:\n"
        "  - name: hca0\n    containerEdits:\n      deviceNodes:\n"
        f"        - {{path: /dev/infiniband/uverbs0, type: c, major: {UVERBS_MAJOR}, minor: 192}}\n"
        "  - name: hca8\n    containerEdits:\n      deviceNodes:\n"
        f"        - {{path: /dev/infiniband/uverbs8, type: c, major: {UVERBS_MAJOR}, minor: 200}}\n"
        f"        - {{path: /dev/infiniband/rdma_cm, type: c, major: 10, minor: 58}}\n"
    )
    inventory = load(host, ("/etc/cdi",))
    assert inventory.resolve("example.com/rdma=hca0").key == "rdma/mlx5_0"
    hca8 = inventory.resolve("example.com/rdma=hca8")
    assert [n.path for n in hca8.nodes] == ["/dev/infiniband/uverbs8", "/dev/infiniband/rdma_cm"]
    assert inventory.location(hca8) is not None
    assert hca8 in inventory.rdma_devices()
    # rdma_cm is nobody's: two RDMA devices never collide on it.
    mine = inventory.footprint(hca8)
    assert mine.exclusive == {(UVERBS_MAJOR, 200)}
    assert not mine.overlaps(inventory.footprint(inventory.resolve("rdma/mlx5_0")))
    # ... while the same uverbs under two names is one physical device.
    assert claims.footprint(inventory.resolve("rdma/mlx5_0")).overlaps(
        inventory.footprint(inventory.resolve("example.com/rdma=hca0"))
    )


def test_a_cdi_rdma_device_without_rdma_cm_gets_it(host: Path) -> None:
    spec_dir = host / "etc/cdi"
    spec_dir.mkdir(parents=True)
    (spec_dir / "r.json").write_text(
        '{"cdiVersion": "0.6.0", "kind": "example.com/rdma", "devices": [{"name": "x",'
        ' "containerEdits": {"deviceNodes": [{"path": "/dev/infiniband/uverbs7",'
        f' "type": "c", "major": {UVERBS_MAJOR}, "minor": 199}}]}}}}]}}'
    )
    x = load(host, ("/etc/cdi",)).resolve("example.com/rdma=x")
    assert CM in x.shared_nodes


def test_a_verbs_device_without_uverbs_is_left_out(tmp_path: Path) -> None:
    root = build_sysfs(build_host(tmp_path), NICS[:1])
    (root / "sys/class/infiniband/mlx5_9").mkdir(parents=True)  # no device link
    keys = [d.key for d in load(root).rdma_devices()]
    assert keys == ["rdma/mlx5_0"]


def test_a_pci_address_maps_to_the_verbs_device_of_that_function(tmp_path: Path) -> None:
    """The SR-IOV network device plugin's IDs: a PF's or a VF's PCI address."""
    vf = FixtureNic(
        "mlx5_3", (*NICS[0].path[:-1], "0000:19:00.2"), 0, 3, "ens1f0v0"
    )  # a VF beside its PF
    root = build_sysfs(build_host(tmp_path))
    add_nic(root, vf)
    inventory = load(root)
    assert inventory.kubelet_device("0000:19:00.0").key == "rdma/mlx5_0"  # the PF
    assert inventory.kubelet_device("0000:19:00.2").key == "rdma/mlx5_3"  # its VF
    assert inventory.pci_device("0000:C1:00.0").key == "rdma/mlx5_1"  # case and domain
    assert inventory.pci_device("00000000:c1:00.0").key == "rdma/mlx5_1"  # width do not count
    assert inventory.kubelet_device("0000:18:00.0").key == BY_INDEX[0].uuid  # a GPU's too
    for nothing in ("0000:19:00.1", "0000:19:00.9", "19:00.0", "mlx5_0", "0"):
        assert inventory.pci_device(nothing) is None


def test_pci_address_forms() -> None:
    assert pci_address("00000000:3B:00.2") == "0000:3b:00.2"
    assert pci_address(" 0001:c1:1f.7 ") == "0001:c1:1f.7"
    for bad in ("0000:3b:00", "3b:00.2", "0000:3b:00.8", "0000:3b:00.2/..", ""):
        assert pci_address(bad) is None


def test_shared_resources_parse_and_cover(inventory: Inventory) -> None:
    """The RDMA shared device plugin's resource: the HCAs it gives, by the names its
    config uses (ifNames), a PCI address or rdma/<name>; fail closed where unknown."""
    every = sorted(d.key for d in inventory.rdma_devices())
    cases = {
        "rdma/hca_shared_devices_a": every,
        "rdma/hca_shared_devices_a=ens2f0": ["rdma/mlx5_1"],
        "rdma/a=rdma/mlx5_0, 0000:41:00.0": ["rdma/mlx5_0", "rdma/mlx5_2"],
        "rdma/a=ens2f0,ens9f9": every,  # one the node lacks: it could be any
        "rdma/a=0": every,  # never a GPU index
    }
    for value, keys in cases.items():
        shared = rdma_resources.parse_shared(value)
        assert sorted(d.key for d in rdma_resources.covered(shared, inventory)) == keys, value
    for bad in ("rdma", "rdma/a=", "rdma/a=x,,y", "rdma/a=../../x y", "/a", "a/"):
        with pytest.raises(ValueError):
            rdma_resources.parse_shared(bad)
    assert rdma_resources.rdma_device("0", inventory) is None  # an RDMA pool's ID, not GPU 0
    assert rdma_resources.rdma_device("0000:18:00.0", inventory) is None  # a GPU's function
    assert rdma_resources.rdma_device("0000:19:00.0", inventory).key == "rdma/mlx5_0"
