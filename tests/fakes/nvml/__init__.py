"""A fake `libnvidia-ml.so.1` built from C: NVML's real ABI, loaded by pynvml's own ctypes.

    lib_dir = build(tmp_path / "nvml")
    config = write_config(tmp_path / "gpus", [FakeGpu("GPU-...", "0000:3b:00.0", minor=2)])
    subprocess.run([...], env=env(lib_dir, config))

pynvml does `CDLL("libnvidia-ml.so.1")`, which the dynamic loader resolves with the
LD_LIBRARY_PATH the process started with: the fake only works in a subprocess.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

SOURCE = Path(__file__).with_name("fake_nvml.c")
SONAME = "libnvidia-ml.so.1"
NVML_ERROR_DRIVER_NOT_LOADED = 9


@dataclass(frozen=True)
class FakeGpu:
    uuid: str
    bus_id: str  # domain:bus:device.function, any case, any domain width
    minor: int
    compute_pids: tuple[int, ...] = ()
    graphics_pids: tuple[int, ...] = ()
    mig: bool | None = None  # MIG mode on or off; None: the GPU is not MIG-capable

    def line(self) -> str:
        parts = [self.uuid, self.bus_id, f"minor={self.minor}"]
        if self.compute_pids:
            parts.append("pids=" + ",".join(map(str, self.compute_pids)))
        if self.graphics_pids:
            parts.append("graphics=" + ",".join(map(str, self.graphics_pids)))
        if self.mig is not None:
            parts.append("mig=on" if self.mig else "mig=off")
        return " ".join(parts)


@dataclass(frozen=True)
class FakeMig:
    """A MIG device under the GPU whose UUID is `parent` (its line comes after the GPUs')."""

    uuid: str
    parent: str
    gi: int
    ci: int
    profile: str = "1g.10gb"
    memory_mib: int = 9856
    slot: int | None = None  # its index under the parent; None: the next free one

    def line(self) -> str:
        parts = [self.uuid, f"parent={self.parent}", f"gi={self.gi}", f"ci={self.ci}"]
        if self.slot is not None:
            parts.append(f"slot={self.slot}")
        parts += [f"profile={self.profile}", f"memory={self.memory_mib}"]
        return " ".join(parts)


def gcc() -> str | None:
    return shutil.which("gcc")


def build(directory: Path) -> Path:
    """Compile the fake into `directory` as libnvidia-ml.so.1; return the directory."""
    compiler = gcc()
    if compiler is None:
        raise RuntimeError("gcc is not installed")
    directory.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [compiler, "-shared", "-fPIC", "-O2", "-Wall", "-o", str(directory / SONAME),
         str(SOURCE)],
        check=True, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    return directory


def write_config(path: Path, gpus: Iterable[FakeGpu], migs: Iterable[FakeMig] = ()) -> Path:
    """The fake's GPUs, one line each, in NVML index order; then its MIG devices."""
    path.write_text("".join(d.line() + "\n" for d in (*gpus, *migs)))
    return path


def env(
    lib_dir: Path | None,
    config: Path | None,
    *,
    init_error: int | None = None,
    base: dict[str, str] | None = None,
) -> dict[str, str]:
    """Environment for a subprocess that loads the fake (or, with lib_dir None, no NVML)."""
    result = dict(os.environ if base is None else base)
    for name in ("FAKE_NVML_CONFIG", "FAKE_NVML_INIT_ERROR"):
        result.pop(name, None)
    if lib_dir is not None:
        inherited = result.get("LD_LIBRARY_PATH")
        result["LD_LIBRARY_PATH"] = f"{lib_dir}:{inherited}" if inherited else str(lib_dir)
    if config is not None:
        result["FAKE_NVML_CONFIG"] = str(config)
    if init_error is not None:
        result["FAKE_NVML_INIT_ERROR"] = str(init_error)
    return result


# Utilization (issue 20): the activity control file, re-read by the fake on every call.
@dataclass(frozen=True)
class FakeActivity:
    """One GPU's activity: device-wide `gpu`/`memory` percentages, per-process samples
    (pid, sm %, memory %), or `unsupported` (NVML_ERROR_NOT_SUPPORTED, as for MIG)."""

    uuid: str
    gpu: int = 0
    memory: int = 0
    processes: tuple[tuple[int, int, int], ...] = ()
    unsupported: bool = False
    # The process samples' timestamp (microseconds): samples the driver took once and
    # keeps, returned only to a caller whose cursor is older. None: taken at each call.
    sampled_at: int | None = None

    def line(self) -> str:
        parts = [self.uuid, f"gpu={self.gpu}", f"memory={self.memory}"]
        if self.processes:
            parts.append("process=" + ",".join(f"{p}:{s}:{m}" for p, s, m in self.processes))
        if self.sampled_at is not None:
            parts.append(f"at={self.sampled_at}")
        if self.unsupported:
            parts.append("unsupported")
        return " ".join(parts)


def write_activity(path: Path, activity: Iterable[FakeActivity]) -> Path:
    """Replace the activity file atomically (a reader never sees half of it)."""
    scratch = path.with_name(path.name + ".new")
    scratch.write_text("".join(a.line() + "\n" for a in activity))
    scratch.replace(path)
    return path


def with_activity(environment: dict[str, str], path: Path) -> dict[str, str]:
    """`environment` plus the activity file the fake reads."""
    return {**environment, "FAKE_NVML_ACTIVITY": str(path)}
