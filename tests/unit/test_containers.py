"""Container references, cgroup paths in every runtime layout, and the bounded cgroup walk."""

from __future__ import annotations

from pathlib import Path

import pytest

from hotmount.errors import InvalidContainerRef
from hotmount.host.containers import (
    MAX_WALK_DEPTH,
    CgroupPaths,
    ContainerRef,
    container_id_from_path,
    find_cgroup_dir,
    parse_container_ref,
    parse_proc_cgroup,
    read_cgroup_pids,
)

CID = "4f2b8c0e9d1a3b5c7e9f0a2b4c6d8e0f1a3b5c7d9e1f2a4b6c8d0e2f4a6b8c0d"
OTHER = "b" * 64
POD_UID = "2d8a1f9e-7c43-4b1a-9f0e-5a6b7c8d9e0f"
POD_UID_ = POD_UID.replace("-", "_")
assert len(CID) == 64


# -- parse_container_ref


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (CID, ContainerRef(container_id=CID)),
        (f"containerd://{CID}", ContainerRef(container_id=CID)),
        (f"cri-o://{CID}", ContainerRef(container_id=CID)),
        (f"docker://{CID}", ContainerRef(container_id=CID)),
        (f"  {CID}\n", ContainerRef(container_id=CID)),
        ("pid:1", ContainerRef(pid=1)),
        ("pid:4242", ContainerRef(pid=4242)),
        ("pid:4194303", ContainerRef(pid=4194303)),
    ],
    ids=[
        "bare", "containerd", "cri-o", "docker", "whitespace", "pid-1-parses", "pid",
        "pid-max-minus-1",
    ],
)  # fmt: skip
def test_parse_container_ref_accepts(text: str, expected: ContainerRef) -> None:
    assert parse_container_ref(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        CID[:12],
        CID[:63],
        CID + "0",
        CID.upper(),
        "g" + CID[1:],
        "",
        "pid:",
        "pid:0",
        "pid:-1",
        "pid:x",
        "pid:12a",
        "pid: 5",
        "pid:4194304",
        "pid:99999999999999999999",
        "pid:\u00b2",  # superscript two: str.isdigit() says yes, int() says no
        "pid:\u0663",  # Arabic-Indic three
        f"rkt://{CID}",
        f"containerd://containerd://{CID}",
        f"containerd:/{CID}",
        f"../../{CID}",
        f"{CID}/../../etc",
        f"/sys/fs/cgroup/{CID}",
        f"{CID[:32]}/{CID[32:63]}",
        f"{CID}\n{OTHER}",
    ],
    ids=[
        "short-12", "hex-63", "hex-65", "uppercase", "non-hex", "empty", "pid-empty", "pid-0",
        "pid-negative", "pid-letters", "pid-trailing-letter", "pid-space", "pid-past-max",
        "pid-huge", "pid-superscript-digit", "pid-arabic-digit", "unknown-runtime",
        "double-prefix", "half-prefix", "traversal-before", "traversal-after", "absolute-path",
        "slash-inside", "two-ids",
    ],
)  # fmt: skip
def test_parse_container_ref_refuses(text: str) -> None:
    with pytest.raises(InvalidContainerRef):
        parse_container_ref(text)


# -- container_id_from_path


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        # cgroupfs driver (v1 and v2 look the same below the root)
        (f"/kubepods/besteffort/pod{POD_UID}/{CID}", CID),
        (f"/kubepods/burstable/pod{POD_UID}/{CID}", CID),
        (f"/kubepods/pod{POD_UID}/{CID}", CID),  # guaranteed QoS
        (f"/kubepods/besteffort/pod{POD_UID}/crio-{CID}", CID),
        (f"/docker/{CID}", CID),
        # systemd driver
        (
            "/kubepods.slice/kubepods-burstable.slice/"
            f"kubepods-burstable-pod{POD_UID_}.slice/cri-containerd-{CID}.scope",
            CID,
        ),
        (f"/kubepods.slice/kubepods-pod{POD_UID_}.slice/cri-containerd-{CID}.scope", CID),
        (
            "/kubepods.slice/kubepods-besteffort.slice/"
            f"kubepods-besteffort-pod{POD_UID_}.slice/crio-{CID}.scope",
            CID,
        ),
        (
            "/kubepods.slice/kubepods-besteffort.slice/"
            f"kubepods-besteffort-pod{POD_UID_}.slice/crio-{CID}.scope/container",
            CID,
        ),
        (
            "/kubepods.slice/kubepods-besteffort.slice/"
            f"kubepods-besteffort-pod{POD_UID_}.slice/crio-conmon-{CID}.scope",
            None,
        ),
        (f"/system.slice/docker-{CID}.scope", CID),
        (f"/machine.slice/libpod-{CID}.scope", CID),
        (f"/machine.slice/libpod-{CID}.scope/container", CID),
        # not containers
        ("/", None),
        ("", None),
        ("/container", None),
        (f"/kubepods/besteffort/pod{POD_UID}", None),
        (f"/kubepods.slice/kubepods-pod{POD_UID_}.slice", None),
        ("/user.slice/user-1000.slice/session-3.scope", None),
        ("/system.slice/containerd.service", None),
        (f"/kubepods/besteffort/pod{POD_UID}/{CID}/extra", None),
        (f"/kubepods/besteffort/pod{POD_UID}/{CID[:63]}", None),
        (f"/kubepods/besteffort/pod{POD_UID}/{CID.upper()}", None),
        (f"/system.slice/podman-{CID}.scope", None),
        (f"/system.slice/docker-{CID}.service", None),
    ],
    ids=[
        "cgroupfs-containerd-besteffort", "cgroupfs-burstable", "cgroupfs-guaranteed",
        "cgroupfs-crio", "docker-cgroupfs", "systemd-containerd-burstable",
        "systemd-containerd-guaranteed", "systemd-crio", "systemd-crio-nested-container",
        "crio-conmon", "docker-systemd", "podman-libpod", "podman-libpod-nested",
        "root", "empty", "bare-container", "pod-cgroupfs", "pod-systemd", "user-session",
        "service", "below-container", "hex-63", "uppercase", "unknown-prefix", "service-suffix",
    ],
)  # fmt: skip
def test_container_id_from_path(path: str, expected: str | None) -> None:
    assert container_id_from_path(path) == expected


# -- parse_proc_cgroup

V1_TEXT = f"""\
12:hugetlb:/kubepods/besteffort/pod{POD_UID}/{CID}
11:devices:/kubepods/besteffort/pod{POD_UID}/{CID}
10:cpu,cpuacct:/kubepods/besteffort/pod{POD_UID}/{CID}
9:net_cls,net_prio:/kubepods/besteffort/pod{POD_UID}/{CID}
3:memory:/kubepods/besteffort/pod{POD_UID}/{CID}
1:name=systemd:/kubepods/besteffort/pod{POD_UID}/{CID}
"""

HYBRID_TEXT = f"""\
12:pids:/system.slice/docker-{CID}.scope
11:cpuset:/system.slice/docker-{CID}.scope
6:devices:/system.slice/docker-{CID}.scope
1:name=systemd:/system.slice/docker-{CID}.scope
0::/system.slice/docker-{CID}.scope
"""

V2_PATH = (
    "/kubepods.slice/kubepods-burstable.slice/"
    f"kubepods-burstable-pod{POD_UID_}.slice/cri-containerd-{CID}.scope"
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (V1_TEXT, CgroupPaths(f"/kubepods/besteffort/pod{POD_UID}/{CID}", None)),
        (
            HYBRID_TEXT,
            CgroupPaths(f"/system.slice/docker-{CID}.scope", f"/system.slice/docker-{CID}.scope"),
        ),
        (f"0::{V2_PATH}\n", CgroupPaths(None, V2_PATH)),
        ("0::/\n", CgroupPaths(None, "/")),
        ("0::/init.scope\n", CgroupPaths(None, "/init.scope")),
        ("0::/odd:name\n", CgroupPaths(None, "/odd:name")),
        ("1:name=systemd:/x\n5:cpu:/y\n", CgroupPaths(None, None)),
        ("3:name=devices:/x\n", CgroupPaths(None, None)),
        ("4:cpu,devices,memory:/co-mounted\n", CgroupPaths("/co-mounted", None)),
        ("", CgroupPaths(None, None)),
    ],
    ids=[
        "v1", "hybrid", "v2", "v2-root", "v2-host-init", "colon-in-path", "v1-without-devices",
        "named-hierarchy-is-not-devices", "co-mounted-devices", "empty",
    ],
)  # fmt: skip
def test_parse_proc_cgroup(text: str, expected: CgroupPaths) -> None:
    assert parse_proc_cgroup(text) == expected


# -- find_cgroup_dir: a bounded breadth-first walk


def make_dirs(root: Path, relative: str, procs: str | None = None) -> Path:
    path = root / relative
    path.mkdir(parents=True)
    if procs is not None:
        (path / "cgroup.procs").write_text(procs)
    return path


def nested(depth: int, leaf: str) -> str:
    """A path `depth` components below the root whose last component is `leaf`."""
    return "/".join([*(f"level{i}.slice" for i in range(1, depth)), leaf])


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    make_dirs(tmp_path, "system.slice/containerd.service", "812\n")
    make_dirs(tmp_path, f"kubepods.slice/kubepods-pod{POD_UID_}.slice/cri-containerd-{OTHER}.scope")
    return tmp_path


def test_finds_a_systemd_scope_five_levels_deep(tree: Path) -> None:
    where = (
        "kubepods.slice/kubepods-burstable.slice/"
        f"kubepods-burstable-pod{POD_UID_}.slice/extra.slice/cri-containerd-{CID}.scope"
    )
    assert where.count("/") + 1 == 5
    expected = make_dirs(tree, where, "4242\n")
    assert find_cgroup_dir(tree, CID) == expected


@pytest.mark.parametrize(
    "leaf",
    [CID, f"crio-{CID}.scope", f"docker-{CID}.scope", f"libpod-{CID}"],
    ids=["cgroupfs", "crio", "docker", "libpod-no-scope"],
)
def test_finds_every_layout(tree: Path, leaf: str) -> None:
    expected = make_dirs(tree, f"kubepods/besteffort/pod{POD_UID}/{leaf}")
    assert find_cgroup_dir(tree, CID) == expected


def test_prefers_crio_nested_container_cgroup_when_it_holds_processes(tree: Path) -> None:
    scope = make_dirs(tree, f"kubepods.slice/crio-{CID}.scope")
    inner = make_dirs(tree, f"kubepods.slice/crio-{CID}.scope/container", "77\n")
    assert find_cgroup_dir(tree, CID) == inner
    (inner / "cgroup.procs").unlink()
    assert find_cgroup_dir(tree, CID) == scope


def test_skips_conmon_and_files_named_after_the_container(tree: Path) -> None:
    make_dirs(tree, f"kubepods.slice/crio-conmon-{CID}.scope")
    (tree / "kubepods.slice" / f"{CID}").write_text("a file, not a cgroup")
    assert find_cgroup_dir(tree, CID) is None


def test_does_not_follow_symlinks(tree: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    elsewhere = tmp_path_factory.mktemp("elsewhere")
    make_dirs(elsewhere, CID)
    (tree / "link.slice").symlink_to(elsewhere)
    assert find_cgroup_dir(tree, CID) is None


def test_absent_id_is_none(tree: Path) -> None:
    assert find_cgroup_dir(tree, CID) is None


def test_missing_root_is_none(tmp_path: Path) -> None:
    assert find_cgroup_dir(tmp_path / "absent", CID) is None


def test_shallowest_match_wins(tree: Path) -> None:
    make_dirs(tree, nested(4, CID))
    shallow = make_dirs(tree, f"z.slice/docker-{CID}.scope")
    assert find_cgroup_dir(tree, CID) == shallow


@pytest.mark.parametrize(
    ("depth", "found"),
    [(MAX_WALK_DEPTH - 1, True), (MAX_WALK_DEPTH, True), (MAX_WALK_DEPTH + 1, False)],
    ids=["depth-max-minus-1", "depth-max", "depth-max-plus-1"],
)
def test_walk_is_depth_bounded(tree: Path, depth: int, found: bool) -> None:
    target = make_dirs(tree, nested(depth, f"cri-containerd-{CID}.scope"))
    assert len(target.relative_to(tree).parts) == depth
    assert find_cgroup_dir(tree, CID) == (target if found else None)


# -- the PIDs of a cgroup and its descendants


def test_cgroup_pids_include_every_descendant(tmp_path: Path) -> None:
    """A leaf (no subdirectory) is read without listing it; a cgroup with children is
    walked: a process a container moved into a child cgroup is still the container's."""
    (tmp_path / "cgroup.procs").write_text("7\n3\n")
    (tmp_path / "memory.max").write_text("max\n")  # files are not cgroups
    (tmp_path / "init.scope").mkdir()
    (tmp_path / "init.scope" / "cgroup.procs").write_text("11\n")
    (tmp_path / "init.scope" / "deeper").mkdir()
    (tmp_path / "init.scope" / "deeper" / "cgroup.procs").write_text("12\n")

    assert read_cgroup_pids(tmp_path) == [3, 7, 11, 12]
    assert read_cgroup_pids(tmp_path / "init.scope" / "deeper") == [12]
    assert read_cgroup_pids(tmp_path / "gone") == []
