"""A fixture host tree: what `/proc`, `/dev` and `/sys` look like on a 3-GPU node.

Built in a tmp dir and read through a `HostRoot`, exactly as the engine reads
the real host. The GPUs are deliberately awkward: their minors are not their
indexes, and the directories are created out of PCI order.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

NVIDIA_UVM_MAJOR = 511
NVIDIA_CAPS_MAJOR = 236


@dataclass(frozen=True)
class FixtureGpu:
    index: int  # what nvidia-smi would print: PCI bus id order
    bus_id: str
    minor: int
    uuid: str


# Listed in the order their directories are created (not PCI order).
GPUS = (
    FixtureGpu(2, "0000:86:00.0", 0, "GPU-86f3a0c1-0000-4000-8000-000000000086"),
    FixtureGpu(1, "0000:3b:00.0", 2, "GPU-3b2d9e44-0000-4000-8000-00000000003b"),
    FixtureGpu(0, "0000:18:00.0", 5, "GPU-18a7b6c5-0000-4000-8000-000000000018"),
)
BY_INDEX = {gpu.index: gpu for gpu in GPUS}

# One MIG instance (GI 1, CI 0) on the GPU with minor 2 (index 1).
MIG_GPU = BY_INDEX[1]
MIG_GI, MIG_CI = 1, 0
MIG_GI_CAP, MIG_CI_CAP = 30, 31
MIG_KEY = f"MIG-{MIG_GPU.uuid}/{MIG_GI}/{MIG_CI}"

PROC_DEVICES = f"""\
Character devices:
  1 mem
  4 /dev/vc/0
  4 tty
  5 /dev/tty
 10 misc
136 pts
195 nvidia-frontend
{NVIDIA_CAPS_MAJOR} nvidia-caps
{NVIDIA_UVM_MAJOR} nvidia-uvm

Block devices:
  7 loop
  8 sd
259 blkext
{NVIDIA_UVM_MAJOR + 1} nvidia-uvm
"""


def information(gpu: FixtureGpu) -> str:
    # As the 535 driver writes it: tabs, and NVML-style upper-case hex.
    return (
        "Model: \t\t NVIDIA A100-SXM4-40GB\n"
        "IRQ:   \t\t 52\n"
        f"GPU UUID: \t {gpu.uuid}\n"
        "Video BIOS: \t 92.00.36.00.01\n"
        "Bus Type: \t PCIe\n"
        "DMA Size: \t 47 bits\n"
        "DMA Mask: \t 0x7fffffffffff\n"
        f"Bus Location: \t {gpu.bus_id.upper()}\n"
        f"Device Minor: \t {gpu.minor}\n"
        "GPU Excluded:\t No\n"
    )


def write(root: Path, absolute: str, text: str = "") -> Path:
    path = root / absolute.lstrip("/")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def build_host(root: Path, *, mig: bool = True, modeset: bool = False) -> Path:
    """Populate `root` as a GPU node's host root; returns `root`."""
    for gpu in GPUS:
        write(root, f"/proc/driver/nvidia/gpus/{gpu.bus_id}/information", information(gpu))
        write(root, f"/dev/nvidia{gpu.minor}")  # a placeholder: nothing stats it
    write(root, "/dev/nvidiactl")
    if modeset:
        write(root, "/dev/nvidia-modeset")
    write(root, "/proc/devices", PROC_DEVICES)
    if mig:
        g = MIG_GPU.minor
        write(
            root,
            "/proc/driver/nvidia-caps/mig-minors",
            "config 1\nmonitor 2\n"
            f"gpu{g}/gi{MIG_GI}/access {MIG_GI_CAP}\n"
            f"gpu{g}/gi{MIG_GI}/ci{MIG_CI}/access {MIG_CI_CAP}\n"
            f"gpu{g}/gi2/access 40\n"  # a possible instance that does not exist
            f"gpu{g}/gi2/ci0/access 41\n"
            "gpu9/gi1/access 50\ngpu9/gi1/ci0/access 51\n",
        )
        write(root, f"/proc/driver/nvidia/capabilities/gpu{g}/mig/gi{MIG_GI}/access", "")
        write(root, f"/proc/driver/nvidia/capabilities/gpu{g}/mig/gi{MIG_GI}/ci{MIG_CI}/access")
        # An instance on a minor that is no GPU of ours, and one missing from mig-minors.
        write(root, "/proc/driver/nvidia/capabilities/gpu9/mig/gi1/ci0/access")
        write(root, f"/proc/driver/nvidia/capabilities/gpu{g}/mig/gi3/ci0/access")
    write(root, "/sys/fs/cgroup/cgroup.controllers")
    return root
