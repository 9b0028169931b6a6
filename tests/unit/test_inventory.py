"""The inventory is the allow-list: GPUs from procfs, MIG instances, CDI specs, and refusals."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
import yaml

from hotmount.devices import cdi
from hotmount.devices.inventory import Inventory
from hotmount.devices.model import DeviceKind, DeviceNode
from hotmount.errors import DeviceNotFound, InvalidDeviceRef
from hotmount.hostfs import HostRoot
from tests.unit.hosttree import (
    BY_INDEX,
    GPUS,
    MIG_CI_CAP,
    MIG_GI_CAP,
    MIG_GPU,
    MIG_KEY,
    NVIDIA_CAPS_MAJOR,
    NVIDIA_UVM_MAJOR,
    build_host,
    write,
)

CONTROL = (
    DeviceNode("/dev/nvidiactl", 195, 255),
    DeviceNode("/dev/nvidia-uvm", NVIDIA_UVM_MAJOR, 0),
    DeviceNode("/dev/nvidia-uvm-tools", NVIDIA_UVM_MAJOR, 1),
)


def load(root: Path, cdi_dirs: tuple[str, ...] = ()) -> Inventory:
    return Inventory.load(HostRoot(root), cdi_dirs, use_nvml=False)


@pytest.fixture
def host(tmp_path: Path) -> Path:
    return build_host(tmp_path)


@pytest.fixture
def inventory(host: Path) -> Inventory:
    return load(host)


# -- GPUs from /proc/driver/nvidia


def test_gpus_are_indexed_in_pci_bus_order_not_by_minor(inventory: Inventory) -> None:
    gpus = [d for d in inventory.devices if d.kind == DeviceKind.GPU]
    assert [(d.index, d.pci_bus_id, d.minor) for d in gpus] == [
        (0, "0000:18:00.0", 5),
        (1, "0000:3b:00.0", 2),
        (2, "0000:86:00.0", 0),
    ]


@pytest.mark.parametrize("index", [0, 1, 2], ids=["idx0-minor5", "idx1-minor2", "idx2-minor0"])
def test_gpu_needs_its_own_minor_node_plus_the_control_nodes(
    inventory: Inventory, index: int
) -> None:
    expected = BY_INDEX[index]
    device = inventory.resolve(str(index))
    assert device.key == device.uuid == expected.uuid
    assert device.nodes == (DeviceNode(f"/dev/nvidia{expected.minor}", 195, expected.minor),)
    assert device.shared_nodes == CONTROL
    assert device.aliases == (str(index),)


@pytest.mark.parametrize("modeset", [False, True], ids=["no-modeset", "modeset-node-present"])
def test_modeset_node_joins_the_control_nodes_only_where_the_host_has_it(
    tmp_path: Path, modeset: bool
) -> None:
    device = load(build_host(tmp_path, modeset=modeset)).resolve("0")
    has_modeset = DeviceNode("/dev/nvidia-modeset", 195, 254) in device.shared_nodes
    assert has_modeset is modeset


def test_without_uvm_in_proc_devices_only_nvidiactl_is_shared(host: Path) -> None:
    write(host, "/proc/devices", "Character devices:\n195 nvidia-frontend\n")
    assert load(host).resolve("0").shared_nodes == (DeviceNode("/dev/nvidiactl", 195, 255),)


def test_unreadable_information_file_skips_that_gpu_only(host: Path) -> None:
    write(host, "/proc/driver/nvidia/gpus/0000:01:00.0/information", "GPU UUID: \t GPU-x\n")
    gpus = [d for d in load(host).devices if d.kind == DeviceKind.GPU]
    assert sorted(d.uuid for d in gpus) == sorted(g.uuid for g in GPUS)


def test_no_nvidia_driver_means_no_gpus(tmp_path: Path) -> None:
    assert load(tmp_path).devices == []


# -- MIG


def test_mig_instance_needs_parent_node_and_both_caps(inventory: Inventory) -> None:
    migs = [d for d in inventory.devices if d.kind == DeviceKind.MIG]
    # gi2 is possible but absent; gpu9 is no GPU; gi3 has no minors: only one exists.
    assert [d.key for d in migs] == [MIG_KEY]
    (device,) = migs
    assert device.nodes == (
        DeviceNode(f"/dev/nvidia{MIG_GPU.minor}", 195, MIG_GPU.minor),
        DeviceNode(f"/dev/nvidia-caps/nvidia-cap{MIG_GI_CAP}", NVIDIA_CAPS_MAJOR, MIG_GI_CAP),
        DeviceNode(f"/dev/nvidia-caps/nvidia-cap{MIG_CI_CAP}", NVIDIA_CAPS_MAJOR, MIG_CI_CAP),
    )
    assert device.shared_nodes == CONTROL
    assert device.parent == MIG_GPU.uuid
    assert device.minor == MIG_GPU.minor


def test_no_mig_without_nvidia_caps_major(host: Path) -> None:
    write(host, "/proc/devices", f"Character devices:\n{NVIDIA_UVM_MAJOR} nvidia-uvm\n")
    assert [d for d in load(host).devices if d.kind == DeviceKind.MIG] == []


# -- resolving names


@pytest.mark.parametrize(
    ("ref", "key"),
    [
        ("0", BY_INDEX[0].uuid),
        ("2", BY_INDEX[2].uuid),
        (BY_INDEX[1].uuid, BY_INDEX[1].uuid),
        (f"  {BY_INDEX[1].uuid}\n", BY_INDEX[1].uuid),
        (MIG_KEY, MIG_KEY),
        (f"{MIG_GPU.index}:1:0", MIG_KEY),
    ],
    ids=["index-0", "index-2", "uuid", "uuid-with-whitespace", "mig-key", "mig-alias"],
)
def test_resolve_by_every_name(inventory: Inventory, ref: str, key: str) -> None:
    assert inventory.resolve(ref).key == key


@pytest.mark.parametrize(
    ("ref", "says"),
    [
        ("195:0", "raw major:minor"),
        ("c 195:0 rwm", "raw major:minor"),
        ("b 8:0 rw", "raw major:minor"),
        ("*:*", "raw major:minor"),
        ("a *:* rwm", "raw major:minor"),
        ("/dev/sda", "is a path"),
        ("/dev/nvidia0", "is a path"),
        ("", "is not a device name"),
        ("rm -rf /", "is not a device name"),
        ("../../dev/sda", "is not a device name"),
        ("GPU-", "is not a device name"),
        ("0; reboot", "is not a device name"),
        ("1000", "is not a device name"),
        ("nvidia.com/gpu", "is not a device name"),
        ("1:1", "raw major:minor"),
        ("1:1:0:0", "is not a device name"),
    ],
    ids=[
        "raw-pair", "raw-v1-line", "raw-block-line", "raw-wildcard", "allow-all-line",
        "block-path", "char-path", "empty", "shell", "traversal", "uuid-prefix-only",
        "shell-suffix", "index-too-long", "cdi-without-name", "two-part-alias-is-raw",
        "four-part-alias",
    ],
)  # fmt: skip
def test_malformed_refs_are_refused_before_lookup(
    inventory: Inventory, ref: str, says: str
) -> None:
    with pytest.raises(InvalidDeviceRef) as caught:
        inventory.resolve(ref)
    assert says in caught.value.message


@pytest.mark.parametrize(
    "ref",
    ["3", "99", "GPU-00000000-0000-0000-0000-000000000000", "MIG-GPU-nope/1/0", "x.com/y=z"],
    ids=["index-past-end", "index-99", "unknown-uuid", "unknown-mig", "unknown-cdi"],
)
def test_well_formed_but_unknown_refs_are_not_found(inventory: Inventory, ref: str) -> None:
    with pytest.raises(DeviceNotFound):
        inventory.resolve(ref)


def test_resolve_all_collapses_duplicates_in_first_seen_order(inventory: Inventory) -> None:
    devices = inventory.resolve_all(["2", BY_INDEX[2].uuid, "0", "2", MIG_KEY])
    assert [d.key for d in devices] == [BY_INDEX[2].uuid, BY_INDEX[0].uuid, MIG_KEY]


def test_resolve_all_refuses_an_empty_list(inventory: Inventory) -> None:
    with pytest.raises(InvalidDeviceRef, match="no device"):
        inventory.resolve_all([])


def test_resolve_all_refuses_the_whole_request_for_one_bad_ref(inventory: Inventory) -> None:
    with pytest.raises(InvalidDeviceRef, match="raw"):
        inventory.resolve_all(["0", "1", "195:0"])


# -- CDI specs

YAML_SPEC = """\
cdiVersion: "0.3.0"
kind: nvidia.com/gpu
containerEdits:
  env: ["NVIDIA_VISIBLE_DEVICES=void"]
  deviceNodes:
    - path: /dev/nvidiactl
      type: c
      major: 195
      minor: 255
devices:
  - name: "0"
    containerEdits:
      deviceNodes:
        - {path: /dev/nvidia5, type: c, major: 195, minor: 5, fileMode: 0640, permissions: rw}
  - name: ro
    containerEdits:
      deviceNodes:
        - {path: /dev/nvidia2, type: c, major: 195, minor: 2, fileMode: "0600", permissions: r}
"""

JSON_SPEC = {
    "cdiVersion": "0.8.0",
    "kind": "example.com/nic",
    "devices": [
        {
            "name": "nic0",
            "containerEdits": {
                "deviceNodes": [
                    {
                        "path": "/dev/infiniband/uverbs0",
                        "type": "c",
                        "major": 231,
                        "minor": 192,
                        "fileMode": 0o644,
                    }
                ]
            },
        },
        {
            "name": "disk",
            "containerEdits": {
                "deviceNodes": [{"path": "/dev/sdb", "type": "b", "major": 8, "minor": 16}]
            },
        },
    ],
}


@pytest.fixture
def cdi_host(host: Path) -> Path:
    write(host, "/etc/cdi/nvidia.yaml", YAML_SPEC)
    write(host, "/var/run/cdi/nic.json", json.dumps(JSON_SPEC))
    write(host, "/etc/cdi/README.txt", "not a spec: ignored by suffix")
    return host


@pytest.fixture
def cdi_inventory(cdi_host: Path) -> Inventory:
    return load(cdi_host, ("/etc/cdi", "/var/run/cdi", "/nonexistent/cdi"))


def test_cdi_devices_from_yaml_and_json(cdi_inventory: Inventory) -> None:
    cdi_keys = [d.key for d in cdi_inventory.devices if d.kind == DeviceKind.CDI]
    assert cdi_keys == ["nvidia.com/gpu=0", "nvidia.com/gpu=ro", "example.com/nic=nic0"]
    # CDI devices come on top of the GPUs, not instead of them.
    assert cdi_inventory.resolve("0").kind == DeviceKind.GPU


def test_cdi_spec_level_edits_are_shared_nodes(cdi_inventory: Inventory) -> None:
    device = cdi_inventory.resolve("nvidia.com/gpu=0")
    assert device.nodes == (DeviceNode("/dev/nvidia5", 195, 5, 0o640, "rw"),)
    assert device.shared_nodes == (DeviceNode("/dev/nvidiactl", 195, 255),)
    assert cdi_inventory.resolve("example.com/nic=nic0").shared_nodes == ()


@pytest.mark.parametrize(
    ("name", "file_mode", "permissions"),
    [
        ("nvidia.com/gpu=0", 0o640, "rw"),
        ("nvidia.com/gpu=ro", 0o600, "r"),
        ("example.com/nic=nic0", 0o644, "rw"),
    ],
    ids=["yaml-octal-int", "yaml-octal-string-readonly", "json-decimal-int-default-perms"],
)
def test_cdi_file_mode_and_permissions_are_honoured(
    cdi_inventory: Inventory, name: str, file_mode: int, permissions: str
) -> None:
    (node,) = cdi_inventory.resolve(name).nodes
    assert (node.file_mode, node.permissions) == (file_mode, permissions)
    assert node.rule.access == {"r": 2, "rw": 6}[permissions]


def test_cdi_device_with_a_block_node_is_refused_with_the_reason(
    cdi_inventory: Inventory,
) -> None:
    assert "block" in cdi_inventory.refused["example.com/nic=disk"]
    with pytest.raises(InvalidDeviceRef, match="block"):
        cdi_inventory.resolve("example.com/nic=disk")


@pytest.mark.parametrize(
    ("version", "accepted"),
    [("0.3.0", True), ("0.5.0", True), ("0.8.0", True), ("0.2.0", False), ("1.0.0", False)],
    ids=["0.3.0", "0.5.0", "0.8.0", "0.2.0-too-old", "1.0.0-too-new"],
)
@pytest.mark.parametrize("suffix", [".yaml", ".json"], ids=["yaml", "json"])
def test_cdi_versions(host: Path, version: str, accepted: bool, suffix: str) -> None:
    spec = {
        "cdiVersion": version,
        "kind": "vendor.com/thing",
        "devices": [
            {
                "name": "a",
                "containerEdits": {
                    "deviceNodes": [{"path": "/dev/thing0", "type": "c", "major": 240, "minor": 0}]
                },
            }
        ],
    }
    text = json.dumps(spec) if suffix == ".json" else yaml.safe_dump(spec)
    write(host, f"/etc/cdi/thing{suffix}", text)
    inventory = load(host, ("/etc/cdi",))
    if accepted:
        assert inventory.resolve("vendor.com/thing=a").nodes == (DeviceNode("/dev/thing0", 240, 0),)
    else:
        with pytest.raises(DeviceNotFound):
            inventory.resolve("vendor.com/thing=a")


@pytest.mark.parametrize(
    "text",
    ["{not json", "- a list\n- not a mapping\n", "cdiVersion: '0.3.0'\nkind: noslash\n"],
    ids=["unparseable", "not-a-mapping", "bad-kind"],
)
def test_a_broken_spec_is_ignored_and_the_others_still_load(cdi_host: Path, text: str) -> None:
    write(cdi_host, "/etc/cdi/aaa-broken.yaml", text)
    inventory = load(cdi_host, ("/etc/cdi",))
    assert inventory.resolve("nvidia.com/gpu=0").nodes[0].path == "/dev/nvidia5"


def test_cdi_node_without_numbers_is_stat_ed_on_the_host(host: Path) -> None:
    # The host's node is a symlink to the real /dev/null: a character device, 1:3.
    if not stat.S_ISCHR(os.stat("/dev/null").st_mode):
        pytest.skip("this machine's /dev/null is not a character device")
    (host / "dev" / "hostnull").symlink_to("/dev/null")
    spec = {
        "cdiVersion": "0.6.0",
        "kind": "vendor.com/null",
        "devices": [
            {
                "name": "n",
                "containerEdits": {
                    "deviceNodes": [{"path": "/dev/null0", "hostPath": "/dev/hostnull"}]
                },
            },
            {
                "name": "missing",
                "containerEdits": {"deviceNodes": [{"path": "/dev/absent"}]},
            },
        ],
    }
    write(host, "/etc/cdi/null.json", json.dumps(spec))
    inventory = load(host, ("/etc/cdi",))
    st = os.stat("/dev/null")
    assert inventory.resolve("vendor.com/null=n").nodes == (
        DeviceNode("/dev/null0", os.major(st.st_rdev), os.minor(st.st_rdev)),
    )
    assert "unreadable" in inventory.refused["vendor.com/null=missing"]


# -- cdi.parse_spec with a stat function


def fake_host_nodes(path: str) -> tuple[str, int, int]:
    nodes = {"/dev/net/tun": ("c", 10, 200), "/dev/sdc": ("b", 8, 32), "/dev/u0": ("u", 240, 7)}
    if path not in nodes:
        raise cdi.CdiError(f"{path}: not on the host")
    return nodes[path]


def spec_with(*device_nodes: dict[str, object]) -> dict[str, object]:
    return {
        "cdiVersion": "0.7.0",
        "kind": "vendor.com/dev",
        "devices": [
            {"name": f"d{i}", "containerEdits": {"deviceNodes": [node]}}
            for i, node in enumerate(device_nodes)
        ],
    }


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ({"path": "/dev/net/tun"}, DeviceNode("/dev/net/tun", 10, 200)),
        ({"path": "/dev/tun", "hostPath": "/dev/net/tun"}, DeviceNode("/dev/tun", 10, 200)),
        ({"path": "/dev/net/tun", "major": 10}, DeviceNode("/dev/net/tun", 10, 200)),
        ({"path": "/dev/net/tun", "minor": 201}, DeviceNode("/dev/net/tun", 10, 201)),
        ({"path": "/dev/u0", "permissions": "rwm"}, DeviceNode("/dev/u0", 240, 7, 0o666, "rwm")),
    ],
    ids=["all-from-stat", "host-path", "minor-from-stat", "given-minor-wins", "unbuffered-u"],
)
def test_parse_spec_fills_missing_numbers_from_the_stat_function(
    raw: dict[str, object], expected: DeviceNode
) -> None:
    devices, refused = cdi.parse_spec(spec_with(raw), fake_host_nodes)
    assert refused == {}
    assert [d.nodes for d in devices] == [(expected,)]


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        ({"path": "/dev/sdc"}, "block device"),
        ({"path": "/dev/sdc", "type": "c"}, None),  # the spec's type wins over stat's
        ({"path": "/dev/x", "type": "p", "major": 1, "minor": 1}, "node type 'p'"),
        ({"path": "/dev/gone"}, "not on the host"),
        ({"path": "/etc/shadow", "type": "c", "major": 1, "minor": 1}, "under /dev/"),
        ({"path": "/dev/../etc/x", "type": "c", "major": 1, "minor": 1}, "under /dev/"),
        ({"path": "/dev/x", "type": "c", "major": 1, "minor": 1, "permissions": "rwx"}, "only"),
        ({"type": "c", "major": 1, "minor": 1}, "no path"),
    ],
    ids=[
        "block-from-stat", "declared-char", "fifo", "absent", "outside-dev", "dotdot",
        "bad-permissions", "no-path",
    ],
)  # fmt: skip
def test_parse_spec_refuses_unusable_nodes_per_device(
    raw: dict[str, object], reason: str | None
) -> None:
    devices, refused = cdi.parse_spec(spec_with(raw), fake_host_nodes)
    if reason is None:
        assert [d.key for d in devices] == ["vendor.com/dev=d0"]
        assert refused == {}
    else:
        assert devices == []
        assert reason in refused["vendor.com/dev=d0"]


def test_parse_spec_refuses_a_device_without_nodes() -> None:
    spec = {"cdiVersion": "0.3.0", "kind": "vendor.com/dev", "devices": [{"name": "env-only"}]}
    devices, refused = cdi.parse_spec(spec, fake_host_nodes)
    assert devices == []
    assert refused == {"vendor.com/dev=env-only": "it has no device nodes"}


def test_parse_spec_bad_spec_level_node_fails_the_whole_spec() -> None:
    spec = spec_with({"path": "/dev/net/tun"})
    spec["containerEdits"] = {"deviceNodes": [{"path": "/dev/sdc"}]}
    with pytest.raises(cdi.CdiError, match=r"spec-level.*block"):
        cdi.parse_spec(spec, fake_host_nodes)


@pytest.mark.parametrize(
    "path",
    [
        "/dev/./nvidia0",
        "/dev//nvidia0",
        "/dev/x/../nvidia0",
        "/dev/nvidia0/",
        "/etc/passwd",
        "dev/x",
    ],
)
def test_device_node_paths_must_be_plain_and_normalised(path: str) -> None:
    with pytest.raises(ValueError, match="plain path under /dev/"):
        DeviceNode(path, 195, 0)
