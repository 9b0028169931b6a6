"""The driver's files, pure: CDI mounts and hooks read (never run), a driver root's
files by version, soname links, and `auto`'s question (hotmount/driver/files.py, elf.py)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from hotmount.driver import elf, files
from hotmount.driver.files import BIND, SYMLINK, DriverFile
from hotmount.errors import DriverUnavailable
from tests.fakes import driver as stand_in
from tests.fakes import nvml

LIB = files.library_dirs()[1]  # /usr/lib/<triplet>


def test_cdi_mounts_hooks_and_env_are_read_for_their_meaning() -> None:
    edits = {
        "env": ["NVIDIA_VISIBLE_DEVICES=void"],
        "mounts": [
            {
                "hostPath": f"/h{LIB}/libcuda.so.1.2",
                "containerPath": f"{LIB}/libcuda.so.1.2",
                "options": ["ro", "bind"],
            }
        ],
        "hooks": [
            {
                "path": "/usr/bin/nvidia-cdi-hook",
                "args": [
                    "nvidia-cdi-hook",
                    "create-symlinks",
                    "--link",
                    f"libcuda.so.1::{LIB}/libcuda.so",
                ],
            },
            {
                "path": "/usr/bin/nvidia-cdi-hook",
                "args": ["nvidia-cdi-hook", "update-ldcache", "--folder", LIB],
            },
            {
                "path": "/usr/bin/nvidia-ctk",
                "args": ["nvidia-ctk", "hook", "chmod", "--mode", "755"],
            },
        ],
    }
    found = files.from_cdi_edits([edits], "spec")
    assert found.binds == [DriverFile(f"{LIB}/libcuda.so.1.2", BIND, f"/h{LIB}/libcuda.so.1.2")]
    assert found.links == [DriverFile(f"{LIB}/libcuda.so", SYMLINK, "libcuda.so.1")]
    assert found.ld_folders == [LIB]
    assert found.env == {"NVIDIA_VISIBLE_DEVICES": "void"}
    assert found.ignored_hooks == ["chmod"]


@pytest.mark.parametrize(
    ("host", "target"),
    [
        ("/run/containerd", "/run/containerd"),  # a daemon's socket directory
        ("/run/containerd", f"{LIB}/libcontainerd.so"),  # under a library's name
        ("/var/lib/kubelet/device-plugins", "/lib/device-plugins"),
        ("/var/lib/kubelet.sock", "/lib/kubelet.sock"),  # not a library's name
        ("/etc/shadow", "/usr/bin/nvidia-shadow"),  # not the same path on the host
        ("/run/nvidia-persistenced/socket", "/run/nvidia-persistenced/socket"),
        (f"/h{LIB}/vdpau", f"{LIB}/vdpau"),
        ("/usr/share/vulkan/icd.d/nvidia_icd.json", "/usr/share/vulkan/icd.d/nvidia_icd.json"),
    ],
    ids=lambda p: p,
)
def test_cdi_mounts_outside_the_drivers_files_are_left_out(host: str, target: str) -> None:
    """Any CDI device's spec is read: only a driver's library, tool or firmware is bound."""
    library = {"hostPath": f"{LIB}/libcuda.so.1.2", "containerPath": f"{LIB}/libcuda.so.1.2"}
    mounts = [library, {"hostPath": host, "containerPath": target, "options": ["rbind"]}]

    found = files.from_cdi_edits([{"mounts": mounts}], "spec")

    assert [b.path for b in found.binds] == [f"{LIB}/libcuda.so.1.2"]
    assert found.ignored_mounts == [f"{host} -> {target}"]


@pytest.mark.parametrize(
    "target",
    [
        f"{LIB}/libnvidia-ml.so.550.1",
        "/usr/bin/nvidia-smi",
        "/lib/firmware/nvidia/550.1",
        "/lib/firmware/nvidia/550.1/gsp.bin",
    ],
)
def test_the_drivers_own_files_are_bound_from_any_root(target: str) -> None:
    for root in ("", "/run/nvidia/driver"):
        mount = {"hostPath": root + target, "containerPath": target}
        assert files.from_cdi_edits([{"mounts": [mount]}], "s").binds == [
            DriverFile(target, BIND, root + target)
        ]


@pytest.mark.parametrize(
    "target",
    ["relative/x", "/proc/self/root", "/dev/nvidia0", "/sys/x", "/usr/../etc/x", "/"],
)
def test_container_paths_outside_the_plain_tree_are_refused(target: str) -> None:
    mount = {"hostPath": "/h/x", "containerPath": target}
    with pytest.raises(DriverUnavailable):
        files.from_cdi_edits([{"mounts": [mount]}], "spec")


def test_non_bind_mounts_and_malformed_links_are_refused() -> None:
    with pytest.raises(DriverUnavailable, match="only bind"):
        files.from_cdi_edits(
            [{"mounts": [{"hostPath": "/h", "containerPath": "/x", "type": "tmpfs"}]}], "s"
        )
    hook = {"args": ["nvidia-cdi-hook", "create-symlinks", "--link", "/no-separator"]}
    with pytest.raises(DriverUnavailable, match="target::link"):
        files.from_cdi_edits([{"hooks": [hook]}], "s")


def test_driver_root_files_by_the_version_nvml_reports_or_the_file_names() -> None:
    listing = {
        LIB: ["libcuda.so.550.1", "libcuda.so.1", "libnvidia-ml.so.550.1", "libnvidia-ml.so.535.2"],
        "/usr/bin": ["nvidia-smi", "ls"],
    }
    found = files.from_driver_root("/run/nvidia/driver", listing, ["550.1"], "550.1")
    assert [f.path for f in found.binds] == [
        f"{LIB}/libcuda.so.550.1", f"{LIB}/libnvidia-ml.so.550.1", "/usr/bin/nvidia-smi",
        "/lib/firmware/nvidia/550.1",
    ]  # fmt: skip
    assert {f.source_root for f in found.binds} == {"/run/nvidia/driver"}
    with pytest.raises(DriverUnavailable, match="several driver versions"):
        files.from_driver_root("/", listing, [], None)
    only = {LIB: ["libnvidia-ml.so.535.2"]}
    assert files.from_driver_root("/", only, [], None).origin.endswith("(version 535.2)")


def test_soname_links_go_where_the_containers_libc_is_or_else_the_env_says() -> None:
    binds = [DriverFile(f"{LIB}/libcuda.so.9.1", BIND, "/h")]
    sonames = {f"{LIB}/libcuda.so.9.1": "libcuda.so.1"}
    links = files.soname_links(binds, sonames, "/lib64", set())
    assert links == [DriverFile("/lib64/libcuda.so.1", SYMLINK, f"{LIB}/libcuda.so.9.1")]
    beside = files.soname_links(binds, sonames, None, set())
    assert beside == [DriverFile(f"{LIB}/libcuda.so.1", SYMLINK, "libcuda.so.9.1")]
    assert files.library_env(binds, None, []) == {"LD_LIBRARY_PATH": LIB}
    assert files.library_env(binds, "/lib64", []) == {}


def test_auto_looks_in_the_default_directories_and_the_containers_own_cache() -> None:
    assert files.has_soname({f"{LIB}/libcuda.so.1"}, None)
    assert files.has_soname(set(), b"glibc-ld.so.cache1.1\0libcuda.so.1\0/x\0")
    assert not files.has_soname(set(), b"libcuda.so.10\0")
    assert not files.has_soname(set(), None)


@pytest.mark.skipif(nvml.gcc() is None, reason="gcc builds the stand-in libraries")
def test_the_soname_is_read_from_a_real_library(tmp_path: Path) -> None:
    root = stand_in.build_root(tmp_path / "driver")
    library = root / stand_in.LIB_DIR.lstrip("/") / f"libnvidia-ml.so.{stand_in.VERSION}"
    assert elf.soname_of_bytes(library.read_bytes()) == "libnvidia-ml.so.1"
    assert elf.soname_of_bytes((root / "usr/bin/nvidia-smi").read_bytes()) is None
    assert elf.soname_of_bytes(b"not an ELF file") is None


@pytest.mark.skipif(nvml.gcc() is None, reason="gcc builds the library")
def test_the_soname_of_a_library_as_large_as_libcuda_is_read(tmp_path: Path) -> None:
    """A real libcuda.so is ~100 MiB and its dynamic section lies past its code, 90 MiB
    in: found on a real H200, where reading only the first 8 MiB found no soname, so a
    plain image got no libcuda.so.1 link and CUDA could not start. 24 MiB of constant
    data here puts the dynamic section past that mark."""
    source = tmp_path / "big.c"
    source.write_text("const char padding[24 << 20] = {1};\nint big(void) { return padding[7]; }\n")
    library = tmp_path / "libbig.so.580.1"
    subprocess.run(
        [
            str(nvml.gcc()),
            "-shared",
            "-fPIC",
            "-Wl,-soname,libbig.so.1",
            "-o",
            str(library),
            str(source),
        ],
        check=True,
    )
    with library.open("rb") as opened:
        fd = opened.fileno()
        assert elf.soname(lambda offset, size: os.pread(fd, size, offset)) == "libbig.so.1"
        assert (
            elf.soname(lambda offset, size: os.pread(fd, size, offset) if offset < 8 << 20 else b"")
            is None
        )


def test_a_cdi_spec_is_parsed_once_per_text_and_again_when_it_changes(tmp_path: Path) -> None:
    """`auto` looks for a driver source on every mount: the specs' YAML is parsed only
    when a file's text changed, in place (even to the same size) or by a new file."""
    from hotmount.driver import sources
    from hotmount.hostfs import HostRoot

    spec = tmp_path / "cdi" / "gpu.yaml"
    spec.parent.mkdir()
    spec.write_text("cdiVersion: 0.5.0\nkind: nvidia.com/gpu\n")
    host = HostRoot(Path("/"))
    first = sources._specs(host, (str(spec.parent),))
    again = sources._specs(host, (str(spec.parent),))
    assert again[0][1] is first[0][1]  # not parsed again
    spec.write_text("cdiVersion: 0.5.0\nkind: example.com/gpu\n")  # same size, in place
    assert sources._specs(host, (str(spec.parent),))[0][1]["kind"] == "example.com/gpu"
    renamed = tmp_path / "new.yaml"
    renamed.write_text("cdiVersion: 0.5.0\nkind: nvidia.com/xyz\n")
    renamed.rename(spec)
    assert sources._specs(host, (str(spec.parent),))[0][1]["kind"] == "nvidia.com/xyz"
    spec.unlink()
    assert sources._specs(host, (str(spec.parent),)) == []
    assert str(spec) not in sources._parsed
