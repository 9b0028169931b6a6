"""The stand-in CUDA world for suspend and resume tests (issue 33): two GPUs of one model
whose nodes have real drivers behind them, the stand-in driver root (libcuda, NVML), and
a rootfs with the stand-in CUDA process (tests/fakes/driver/cuda_process.c).

GPU A is /dev/fuse's 10:229, GPU B /dev/loop-control's 10:237, /dev/nvidiactl /dev/zero's
1:5; their CDI names are their UUIDs (as nvidia-ctk also names them).
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from tests.fakes import driver, nvml
from tests.support.runc import _V2_PREFIX, RuncContainer, make_rootfs
from tests.support.waiting import wait_for

UUID_A = "GPU-aaaaaaaa-0000-4000-8000-000000000001"
UUID_B = "GPU-bbbbbbbb-0000-4000-8000-000000000002"
A, B = f"nvidia.com/gpu={UUID_A}", f"nvidia.com/gpu={UUID_B}"
MODEL = "NVIDIA H200"
SPEC = f"""\
cdiVersion: 0.6.0
kind: nvidia.com/gpu
devices:
  - name: {UUID_A}
    containerEdits:
      deviceNodes: [{{path: /dev/nvidia0, type: c, major: 10, minor: 229}}]
  - name: {UUID_B}
    containerEdits:
      deviceNodes: [{{path: /dev/nvidia1, type: c, major: 10, minor: 237}}]
containerEdits:
  deviceNodes:
    - {{path: /dev/nvidiactl, type: c, major: 1, minor: 5}}
"""
GPU_MAP = ["--gpu", f"{UUID_A}=/dev/nvidia0", "--gpu", f"{UUID_B}=/dev/nvidia1"]


# Nodes with a driver behind them (an open succeeds) that no process of a container holds
# otherwise (not /dev/null's 1:3: every container's init holds that, and would be taken
# for a CUDA process): /dev/net/tun, /dev/autofs, /dev/btrfs-control. Each one stand-in
# GPU more, for benches with more GPUs than A and B (bench/on_demand_bench.py).
MORE_NODES = [(10, 200), (10, 235), (10, 234)]


def standin_uuids(count: int) -> list[str]:
    """A and B, then more of the same model."""
    more = [f"GPU-cccccccc-0000-4000-8000-{i:012d}" for i in range(3, count + 1)]
    return [UUID_A, UUID_B, *more][:count]


def spec_for(count: int) -> str:
    """SPEC with `count` GPUs (at most 5): A and B as in SPEC, then MORE_NODES."""
    if count <= 2:
        return SPEC
    devices = "".join(
        f"  - name: {uuid}\n    containerEdits:\n      deviceNodes: [{{path: /dev/nvidia{i}, "
        f"type: c, major: {major}, minor: {minor}}}]\n"
        for i, (uuid, (major, minor)) in enumerate(
            zip(standin_uuids(count)[2:], MORE_NODES, strict=False), start=2
        )
    )
    head, _, tail = SPEC.partition("containerEdits:\n  deviceNodes:")
    return f"{head}{devices}containerEdits:\n  deviceNodes:{tail}"


def gpu_map(uuids: list[str]) -> list[str]:
    """cuda_process's --gpu arguments for `uuids` (the first is the one it opens), each
    GPU's node named by its place among all the stand-in's GPUs."""
    every = standin_uuids(len(MORE_NODES) + 2)
    return [arg for u in uuids for arg in ("--gpu", f"{u}=/dev/nvidia{every.index(u)}")]


@dataclass(frozen=True)
class StandIn:
    driver_root: Path
    nvml_dir: Path
    rootfs: Path
    cdi_dir: Path


def build_standin(base: Path, gpus: int = 2) -> StandIn:
    """The stand-in driver root (libcuda, NVML), fake NVML, a rootfs with the process;
    `gpus` stand-in GPUs (A, B, then MORE_NODES)."""
    root = driver.build_root(base / "driver")
    lib = nvml.build(base / "nvml")
    rootfs = make_rootfs(base / "image")
    driver.build_cuda_process(rootfs / "bin" / "cuda_process")
    cdi = base / "cdi"
    cdi.mkdir()
    (cdi / "gpus.yaml").write_text(spec_for(gpus))
    return StandIn(root, lib, rootfs, cdi)


def pids_of(container: RuncContainer, command: str) -> list[int]:
    """Host PIDs of the container's processes running `command`."""
    found = []
    for directory in (container.v1_devices_dir, container.v2_dir):
        procs = directory / "cgroup.procs"
        if procs.exists():
            for line in procs.read_text().split():
                comm = Path(f"/proc/{line}/comm")
                if comm.exists() and comm.read_text().strip() == command:
                    found.append(int(line))
    return sorted(set(found))


def container_pid(host_pid: int) -> int:
    """The PID the container's own processes see for `host_pid`: the innermost of its
    `NSpid` (a runc container has a PID namespace of its own)."""
    status = Path(f"/proc/{host_pid}/status").read_text()
    nspid = next(line.split()[1:] for line in status.splitlines() if line.startswith("NSpid:"))
    assert len(nspid) == 2, nspid  # the host's and the container's
    return int(nspid[-1])


def status(container: RuncContainer, name: str = "a") -> str:
    return container.exec("cat", f"/tmp/{name}.status").stdout.strip()


def gpu_fds(pid: int) -> list[str]:
    """The GPU nodes (A, B, nvidiactl by number) a host PID holds open."""
    held = []
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            rdev = os.stat(fd).st_rdev
        except OSError:
            continue
        if (os.major(rdev), os.minor(rdev)) in {(10, 229), (10, 237), (1, 5)}:
            held.append(os.readlink(fd))
    return sorted(held)


def start_cuda(
    container: RuncContainer, *extra: str, status: str = "a", gpus: list[str] = GPU_MAP
) -> tuple[subprocess.Popen[bytes], int]:
    """The stand-in CUDA process on GPU A (runc exec, killed by the caller); its host PID."""
    known = set(pids_of(container, "cuda_process"))
    argv = ["runc", "--root", str(container.state_root), "exec", container.id,
            "/bin/cuda_process", *gpus, "--ctl", "/dev/nvidiactl",
            "--status", f"/tmp/{status}.status", *extra]  # fmt: skip
    if container.mode == "v2":
        argv = ["unshare", "-m", "sh", "-c", _V2_PREFIX, "sh", *argv[1:]]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL)
    assert proc.stdout is not None and b"READY" in proc.stdout.readline()
    pid = wait_for(
        lambda: next((p for p in pids_of(container, "cuda_process") if p not in known), None),
        "the stand-in CUDA process in the container",
    )
    return proc, pid


def nvml_config(path: Path, pids_on_a: list[int]) -> Path:
    gpus = [nvml.FakeGpu(UUID_A, "0000:3b:00.0", 0, compute_pids=tuple(pids_on_a)),
            nvml.FakeGpu(UUID_B, "0000:86:00.0", 1)]  # fmt: skip
    return nvml.write_config(path, gpus)
