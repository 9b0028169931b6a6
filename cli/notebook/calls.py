"""What `%gpu` does, as Python calls platforms import (`from cli.notebook import attach`):
attach, detach, status, list the node's GPUs; and whether this process initialised CUDA
before an attach (then it cannot see the new GPU). They return the agent's models."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, MutableMapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cli.notebook.config import Config

if TYPE_CHECKING:  # the client (pydantic) loads on the first call, not at %load_ext
    from hotmount.wire.schemas import DeviceList, MountResult, PodDevices, UnmountResult

# -- CUDA ------------------------------------------------------------------------------------


def cuda_initialised(modules: Mapping[str, Any] | None = None) -> list[str]:
    """The libraries in this process that have already initialised CUDA. Cheap checks that
    initialise nothing: torch's and jax's own flags when they are imported, then the CUDA
    driver library among the process's mappings (cupy, numba, TensorFlow load it at
    their first CUDA call)."""
    modules = sys.modules if modules is None else modules
    found = []
    torch = modules.get("torch")
    if torch is not None and _quietly(_torch_initialised, torch):
        found.append("torch")
    bridge = modules.get("jax._src.xla_bridge")
    if bridge is not None and _quietly(_jax_initialised, bridge):
        found.append("jax")
    if not found and _libcuda_loaded():
        found.append("the CUDA driver (libcuda)")
    return found


def _torch_initialised(torch: Any) -> bool:
    return bool(torch.cuda.is_initialized())


def _jax_initialised(bridge: Any) -> bool:
    return "cuda" in (bridge._backends or {})  # filled at jax's first device use


def _quietly(check: Any, module: Any) -> bool:
    """A library's own answer; False where it has none (another version's layout)."""
    try:
        return bool(check(module))
    except Exception:
        return False


def _libcuda_loaded(maps: Path = Path("/proc/self/maps")) -> bool:
    try:
        return "/libcuda.so" in maps.read_text()
    except OSError:
        return False


# -- the calls platforms import --------------------------------------------------------------


def attach(
    devices: list[str] | None = None,
    count: int | None = None,
    idle_timeout: str | None = None,
    config: Config | None = None,
    once: bool = False,
    environ: MutableMapping[str, str] | None = None,
) -> MountResult:
    """Hot-mount GPUs into this pod: `devices` by name, else `count` (default 1). They
    come back if the container restarts, unless `once`. withDriver is left to the node
    (auto: the driver's files come when this image has no libcuda.so.1); the environment
    they need goes into `environ` (default `os.environ`: this kernel's subprocesses)."""
    from pydantic import ValidationError

    from hotmount.wire.errors import InvalidRequest, make_status
    from hotmount.wire.schemas import MountRequest

    config = config or Config.from_env()
    try:
        request = MountRequest(
            devices=devices or None,
            count=None if devices else (count or 1),
            container=config.container,
            idle_timeout=idle_timeout or config.idle_timeout,
            once=once or None,
        )
    except ValidationError as exc:
        problems = "; ".join(str(e["msg"]).removeprefix("Value error, ") for e in exc.errors())
        raise InvalidRequest(make_status(400, problems, "BadRequest")) from exc
    with config.client() as client:
        result = client.transport.mount(config.namespace, config.pod, request)
    if result.driver is not None:
        target = os.environ if environ is None else environ
        target.update(environment_after(result.driver.env, target))
    return result


PATH_LISTS = ("LD_LIBRARY_PATH", "PATH")  # the new entries go first; the old ones stay


def environment_after(edits: Mapping[str, str], current: Mapping[str, str]) -> dict[str, str]:
    """The variables to set: `edits`, with a search path put before the one already set."""
    out = {}
    for name, value in edits.items():
        old = current.get(name, "")
        kept = [p for p in old.split(":") if p and p not in value.split(":")]
        out[name] = ":".join([value, *kept]) if name in PATH_LISTS and kept else value
    return out


def detach(devices: list[str] | None = None, config: Config | None = None) -> UnmountResult:
    """Give GPUs back (every hot-mounted one when `devices` is None)."""
    config = config or Config.from_env()
    with config.client() as client:
        return client.unmount(config.namespace, config.pod, devices or None, config.container)


def status(config: Config | None = None) -> PodDevices:
    """What is hot-mounted into this pod, with each GPU's idle timeout and idle time."""
    config = config or Config.from_env()
    with config.client() as client:
        return client.status(config.namespace, config.pod)


def list_gpus(config: Config | None = None) -> list[DeviceList]:
    """Every node's GPUs the caller may see and who holds each (needs `list` on
    `nodedevices`): this node's agent asks the others; nodes that did not answer last."""
    config = config or Config.from_env()
    with config.client() as client:
        return client.list_every_node()
