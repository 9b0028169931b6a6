"""A MIG node for agent tests: GPU 0 (/dev/nvidia3) carved into one MIG instance.

/proc/driver gets the capability files the driver writes for GI 1 / CI 0
(`nvidia/capabilities/gpu3/mig/gi1/ci0/access`, `nvidia-caps/mig-minors`), /proc/devices
an `nvidia-caps` major, and the fake NVML (tests/fakes/nvml) lists the same instance with
its MIG UUID. The capability nodes are stand-ins like the GPU's: a major with no driver,
so `open()` answers ENXIO once granted and EPERM before.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.fakes import nvml as fake_nvml
from tests.fakes.nvml import FakeGpu, FakeMig
from tests.support.agent import GPUS, write_driver_tree

CAPS_MAJOR = 239  # no driver has it here
PARENT = GPUS[0]
GI, CI, GI_CAP, CI_CAP = 1, 0, 21, 22
MIG_UUID = "MIG-5d3c1a2b-0e9f-4a8b-b7c6-d5e4f3a2b1c0"
MIG_KEY = f"MIG-{PARENT.uuid}/{GI}/{CI}"  # the key keeps /proc's form
MIG_ALIAS = f"{PARENT.index}:{GI}:{CI}"
PROFILE, MEMORY_MIB = "1g.18gb", 16384
CAP_PATHS = (f"/dev/nvidia-caps/nvidia-cap{GI_CAP}", f"/dev/nvidia-caps/nvidia-cap{CI_CAP}")


@dataclass(frozen=True)
class MigNode:
    driver: Path  # what goes over /proc/driver
    proc_devices: Path
    nvml_env: dict[str, str]  # the fake NVML's LD_LIBRARY_PATH and config

    def agent_kwargs(self, *, nvml: bool) -> dict[str, Any]:
        """For `Cluster.agent`: with NVML (`--use-nvml` must be passed too) or /proc alone."""
        env = self.nvml_env if nvml else {}
        return {"driver": self.driver, "proc_devices": self.proc_devices, "env": env}


def mig_node(workdir: Path) -> MigNode:
    driver = write_driver_tree(workdir / "mig-driver")
    g = PARENT.minor
    caps = driver / "nvidia" / "capabilities" / f"gpu{g}" / "mig" / f"gi{GI}"
    (caps / f"ci{CI}").mkdir(parents=True)
    (caps / "access").write_text("")
    (caps / f"ci{CI}" / "access").write_text("")
    (driver / "nvidia-caps").mkdir()
    (driver / "nvidia-caps" / "mig-minors").write_text(
        f"config 1\nmonitor 2\ngpu{g}/gi{GI}/access {GI_CAP}\n"
        f"gpu{g}/gi{GI}/ci{CI}/access {CI_CAP}\n"
    )
    proc_devices = workdir / "proc-devices"
    real = Path("/proc/devices").read_text()
    proc_devices.write_text(
        real.replace("Character devices:\n", f"Character devices:\n{CAPS_MAJOR} nvidia-caps\n", 1)
    )
    lib = fake_nvml.build(workdir / "fake-nvml")
    config = fake_nvml.write_config(
        workdir / "nvml.conf",
        [FakeGpu(PARENT.uuid, PARENT.bus_id, PARENT.minor, mig=True)]
        + [FakeGpu(gpu.uuid, gpu.bus_id, gpu.minor) for gpu in GPUS[1:]],
        [FakeMig(MIG_UUID, PARENT.uuid, GI, CI, PROFILE, MEMORY_MIB, slot=2)],
    )
    env = fake_nvml.env(lib, config, base={})
    return MigNode(driver, proc_devices, env)
