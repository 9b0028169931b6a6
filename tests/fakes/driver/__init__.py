"""A stand-in NVIDIA driver: what a driver root holds, built from C for this machine.

    root = build_root(tmp_path / "driver")   # usr/lib/<triplet>/libnvidia-ml.so.<V> ...

- `libnvidia-ml.so.<V>`: tests/fakes/nvml/fake_nvml.c with the soname libnvidia-ml.so.1;
- `libcuda.so.<V>`: a tiny library with the soname libcuda.so.1;
- `usr/bin/nvidia-smi`: nvidia_smi.c, linked against glibc, which dlopens
  libnvidia-ml.so.1 by soname and prints the GPUs (FAKE_NVML_CONFIG names them);
- `lib/firmware/nvidia/<V>/gsp.bin`.

A container that runs it needs a glibc of its own, as every plain image has:
`add_glibc(rootfs)` copies this host's loader and libc into a busybox rootfs.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from hotmount.driver.files import triplet
from tests.fakes import nvml

VERSION = "999.1.2"
HERE = Path(__file__).parent
LIB_DIR = f"/usr/lib/{triplet()}"


def _cc(*args: str) -> None:
    gcc = nvml.gcc()
    assert gcc is not None, "gcc is needed to build the stand-in driver"
    subprocess.run([gcc, "-O2", "-Wall", *args], check=True, capture_output=True, timeout=120)


def build_root(root: Path) -> Path:
    libs = root / LIB_DIR.lstrip("/")
    libs.mkdir(parents=True)
    (root / "usr/bin").mkdir(parents=True)
    _cc("-shared", "-fPIC", "-Wl,-soname,libnvidia-ml.so.1", "-o",
        str(libs / f"libnvidia-ml.so.{VERSION}"), str(nvml.SOURCE))  # fmt: skip
    _cc("-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o",
        str(libs / f"libcuda.so.{VERSION}"), str(HERE / "libcuda.c"))  # fmt: skip
    _cc("-o", str(root / "usr/bin/nvidia-smi"), str(HERE / "nvidia_smi.c"))
    firmware = root / "lib/firmware/nvidia" / VERSION
    firmware.mkdir(parents=True)
    (firmware / "gsp.bin").write_bytes(b"stand-in firmware")
    return root


def add_glibc(rootfs: Path) -> None:
    """This host's dynamic loader and libc, where a Debian image keeps them."""
    loader = Path("/lib64/ld-linux-x86-64.so.2")
    libdir = rootfs / f"lib/{triplet()}"
    libdir.mkdir(parents=True, exist_ok=True)
    shutil.copy(Path(f"/lib/{triplet()}/libc.so.6"), libdir / "libc.so.6")
    if loader.exists():
        (rootfs / "lib64").mkdir(exist_ok=True)
        shutil.copy(loader, rootfs / "lib64" / loader.name)


def build_cuda_process(path: Path) -> Path:
    """The stand-in CUDA process (cuda_process.c), static: it runs in a busybox rootfs."""
    _cc("-static", "-o", str(path), str(HERE / "cuda_process.c"))
    return path
