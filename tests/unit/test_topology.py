"""The nearest-NIC rule, pure: same PCIe switch, then host bridge, then NUMA node."""

from __future__ import annotations

import pytest

from hotmount.devices.topology import (
    Level,
    PciLocation,
    distance,
    nearest,
    nearest_of_each,
    pci_path,
)

ROOT = "pci0000:00"


def loc(*path: str, numa: int | None = 0) -> PciLocation:
    return PciLocation(path[-1], path, numa)


GPU = loc(ROOT, "0000:00:01.0", "0000:01:00.0", "0000:02:00.0", "0000:18:00.0")


def test_pci_path_keeps_the_host_bridge_and_bridges_and_stops_at_the_device() -> None:
    resolved = "/sys/devices/pci0000:00/0000:00:01.0/0000:19:00.0/infiniband_verbs/uverbs0"
    assert pci_path(resolved) == (ROOT, "0000:00:01.0", "0000:19:00.0")
    assert pci_path("/sys/devices/virtual/misc/fuse") == ()


@pytest.mark.parametrize(
    ("nic", "level"),
    [
        (loc(ROOT, "0000:00:01.0", "0000:01:00.0", "0000:02:01.0", "0000:19:00.0"), "switch"),
        (loc(ROOT, "0000:00:03.0", "0000:5e:00.0"), "host-bridge"),
        (loc("pci0000:40", "0000:40:01.0", "0000:41:00.0", numa=0), "numa"),
        (loc("pci0000:c0", "0000:c0:01.0", "0000:c1:00.0", numa=1), "system"),
        (loc("pci0000:40", "0000:40:01.0", "0000:41:00.0", numa=None), "system"),
    ],
    ids=["same-switch", "same-host-bridge", "same-numa", "other-numa", "numa-unknown"],
)
def test_levels(nic: PciLocation, level: str) -> None:
    expected = {
        "switch": Level.PCIE_SWITCH,
        "host-bridge": Level.HOST_BRIDGE,
        "numa": Level.NUMA_NODE,
        "system": Level.SYSTEM,
    }[level]
    assert distance(GPU, nic)[0] is expected


def test_unknown_numa_on_both_sides_is_not_the_same_node() -> None:
    a = loc("pci0000:40", "0000:40:01.0", "0000:41:00.0", numa=None)
    b = loc("pci0000:80", "0000:80:01.0", "0000:81:00.0", numa=None)
    assert distance(a, b)[0] is Level.SYSTEM
    assert distance(loc("pci0000:40", "a", numa=-1), loc("pci0000:80", "b", numa=-1))[0] == 3


def test_the_switch_beats_a_nic_whose_name_sorts_first_on_the_same_numa_node() -> None:
    nics = {
        "rdma/a_same_numa": loc("pci0000:40", "0000:40:01.0", "0000:41:00.0"),
        "rdma/b_host_bridge": loc(ROOT, "0000:00:03.0", "0000:5e:00.0"),
        "rdma/c_switch": loc(ROOT, "0000:00:01.0", "0000:01:00.0", "0000:02:01.0", "0000:19:00.0"),
    }
    assert nearest(GPU, nics) == "rdma/c_switch"
    del nics["rdma/c_switch"]
    assert nearest(GPU, nics) == "rdma/b_host_bridge"
    del nics["rdma/b_host_bridge"]
    assert nearest(GPU, nics) == "rdma/a_same_numa"


def test_the_longest_shared_path_wins_within_one_switch() -> None:
    # Both share the root port; the deeper one also shares the switch's downstream port.
    nics = {
        "rdma/a_upper": loc(ROOT, "0000:00:01.0", "0000:01:00.0", "0000:02:03.0", "0000:30:00.0"),
        "rdma/b_deeper": loc(ROOT, "0000:00:01.0", "0000:01:00.0", "0000:02:00.0", "0000:18:00.1"),
    }
    assert nearest(GPU, nics) == "rdma/b_deeper"


def test_ties_go_to_the_first_name_and_no_candidate_is_none() -> None:
    same = loc("pci0000:40", "0000:40:01.0", "0000:41:00.0")
    assert nearest(GPU, {"rdma/z": same, "rdma/m": same}) == "rdma/m"
    assert nearest(GPU, {}) is None


def test_nearest_of_each_lists_the_gpus_a_nic_is_nearest_to() -> None:
    far = loc("pci0000:c0", "0000:c0:01.0", "0000:c1:00.0", numa=1)
    gpu2 = loc("pci0000:80", "0000:80:01.0", "0000:86:00.0", numa=1)
    near = loc(ROOT, "0000:00:01.0", "0000:01:00.0", "0000:02:01.0", "0000:19:00.0")
    picked = nearest_of_each({"g0": GPU, "g2": gpu2}, {"rdma/far": far, "rdma/near": near})
    assert picked == {"rdma/far": ["g2"], "rdma/near": ["g0"]}
