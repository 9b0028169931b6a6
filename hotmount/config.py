"""The engine's configuration: where the host, the state and the driver's files are,
and what may move. Apart from hotmount/engine/core.py so that the layers the engine drives
(hotmount/suspend/) can read it without importing the engine."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from hotmount.devices.inventory import DEFAULT_CDI_DIRS
from hotmount.netdev.plan import Network

DEFAULT_STATE_DIR = Path("/run/gpu-hotmount/state")  # tmpfs: as long-lived as the kernel state


@dataclass(frozen=True)
class EngineConfig:
    """Fixed for the engine's life: every field has the agent's default."""

    host_root: Path = Path("/")
    cdi_dirs: tuple[str, ...] = DEFAULT_CDI_DIRS
    state_dir: Path = DEFAULT_STATE_DIR
    use_nvml: bool = True
    node_method: str = "auto"  # auto | openat2 | setns
    stop_grace: float = 10.0
    sys_root: Path | None = None  # where /sys is read for RDMA and PCIe places (default: host)
    netdev_allow: tuple[str, ...] = ()  # interfaces (names, globs) that may move; empty: none
    netdev_address_cidrs: tuple[Network, ...] = ()  # where set addresses may lie; empty: none
    driver_root: str | None = None  # where the driver's files are (host path); None: CDI only
    # asked (only a mount that asks) | auto | always | never (an off switch): docs/driver.md
    inject_driver: str = "asked"
    # where the host's / is seen for the driver's files (driver root, CDI hostPaths):
    # the chart mounts it at /host; None: host_root
    driver_host_root: Path | None = None
    # Mount labels (metadata keys) the caller releases when it suspends a container's GPUs
    # (the agent: the pin or holder pod a label names): not carried onto the GPUs a resume
    # mounts. The engine never reads them otherwise.
    released_on_suspend: frozenset[str] = frozenset()
