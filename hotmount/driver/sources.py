"""Where a mount's driver files come from (host reads only), and the container-specific
last step: soname links where the container's linker looks, and the environment.

Order of sources: the CDI spec of a CDI device (its mounts and hooks); else the
node's driver root; else the spec-level mounts of an `nvidia.com/gpu` CDI spec
(what `nvidia-ctk cdi generate` writes) for GPUs named by index or UUID.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from typing import Any

from hotmount.devices import cdi
from hotmount.devices.model import Device, DeviceKind
from hotmount.driver import files
from hotmount.driver.files import DriverFile, DriverSet
from hotmount.driver.place import DriverPlacer, HostSources
from hotmount.errors import DriverUnavailable
from hotmount.hostfs import HostRoot

log = logging.getLogger(__name__)
NVIDIA_KIND = "nvidia.com/gpu"


@dataclass
class DriverPlan:
    """Everything one container gets, in placing order (binds before the links to them)."""

    files: list[DriverFile]
    env: dict[str, str]
    origin: str
    ignored_hooks: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def driver_set(
    host: HostRoot,
    cdi_dirs: tuple[str, ...],
    driver_root: str | None,
    devices: list[Device],
    sources_host: HostRoot | None = None,
) -> DriverSet:
    """`host`: where the CDI specs are read; `sources_host`: where the host's `/` is seen
    for the files themselves (default: `host`)."""
    specs = _specs(host, cdi_dirs)
    edits: list[dict[str, Any]] = []
    origins = []
    for device in devices:
        if device.kind is not DeviceKind.CDI:
            continue
        kind, _, name = device.key.partition("=")
        for path, spec in specs:
            if spec.get("kind") != kind:
                continue
            for entry in spec.get("devices") or []:
                if isinstance(entry, dict) and entry.get("name") == name:
                    edits += [spec.get("containerEdits") or {}, entry.get("containerEdits") or {}]
                    origins.append(path)
    found = files.from_cdi_edits(edits, "CDI spec " + ", ".join(sorted(set(origins))))
    if found.binds:
        return found
    if driver_root is not None:
        return _from_root(sources_host or host, driver_root)
    gpus = [d for d in devices if d.kind in (DeviceKind.GPU, DeviceKind.MIG)]
    for path, spec in specs if gpus else []:
        if spec.get("kind") == NVIDIA_KIND and (spec.get("containerEdits") or {}).get("mounts"):
            found = files.from_cdi_edits([spec["containerEdits"]], f"CDI spec {path}")
            if found.binds:  # none that passed the allow-list: no source
                return found
    raise DriverUnavailable(
        "no driver files for these devices: their CDI spec has no mounts and the node "
        "has no driver root (--driver-root)"
    )


# path -> (the file's text when parsed, the spec): the YAML is parsed again only when
# the text differs (`auto` asks on every mount; parsing was ~1.5 ms of each).
_parsed: dict[str, tuple[str, dict[str, Any]]] = {}
SPEC_SUFFIXES = (".yaml", ".yml", ".json")


def _specs(host: HostRoot, cdi_dirs: tuple[str, ...]) -> list[tuple[str, dict[str, Any]]]:
    """Every spec in `cdi_dirs`, as read-only dicts shared between calls."""
    found = []
    for directory in cdi_dirs:
        try:
            entries = sorted(os.scandir(host.path(directory)), key=lambda e: e.name)
        except OSError:  # no such directory (yet), or not one
            continue
        for entry in entries:
            if os.path.splitext(entry.name)[1] in SPEC_SUFFIXES and entry.is_file():
                try:
                    found.append((entry.path, _spec(entry.path)))
                except cdi.CdiError as exc:
                    log.warning("ignoring CDI spec %s: %s", entry.path, exc)
    for gone in _parsed.keys() - {path for path, _ in found}:
        _parsed.pop(gone, None)
    return found


def _spec(path: str) -> dict[str, Any]:
    """The spec at `path`: the file is read every time, parsed only when its text changed."""
    try:
        with open(path, encoding="utf-8") as file:
            text = file.read()
    except (OSError, ValueError) as exc:
        raise cdi.CdiError(f"unreadable: {exc}") from exc
    hit = _parsed.get(path)
    if hit is not None and hit[0] == text:
        return hit[1]
    spec = cdi.parse(text, os.path.splitext(path)[1])
    _parsed[path] = (text, spec)
    return spec


def _from_root(sources_host: HostRoot, root: str) -> DriverSet:
    sources = HostSources(sources_host)
    try:
        listing = {}
        for directory in (*files.library_dirs(), *files.TOOL_DIRS):
            names = sources.listing(root, directory)
            if names is not None:
                listing[directory] = names
        firmware = sources.listing(root, "/lib/firmware/nvidia") or []
    finally:
        sources.close()
    return files.from_driver_root(root, listing, firmware, nvml_driver_version())


def nvml_driver_version() -> str | None:
    """NVML's driver version where the library loads; None where it does not."""
    try:
        import pynvml  # optional: a node without NVML is normal

        pynvml.nvmlInit()
        try:
            version = pynvml.nvmlSystemGetDriverVersion()
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # no NVML, an old one, or a fake without the call
        return None
    return version.decode() if isinstance(version, bytes) else str(version)


def plan_for(found: DriverSet, placer: DriverPlacer) -> DriverPlan:
    """The container's own part: soname links into its libc directory (or the env)."""
    libc_dir = placer.libc_dir()
    sonames = {b.path: s for b in found.binds if (s := placer.sources.soname(b))}
    taken = {link.path for link in found.links}
    links = found.links + files.soname_links(found.binds, sonames, libc_dir, taken)
    env = {**found.env, **files.library_env(found.binds, libc_dir, found.ld_folders)}
    notes = []
    cache = placer.ld_cache()
    shadowed = sorted(s for s in set(sonames.values()) if cache and s.encode() + b"\0" in cache)
    if shadowed:
        notes.append(
            "the container's own /etc/ld.so.cache names " + ", ".join(shadowed)
            + ": its linker prefers those; set LD_LIBRARY_PATH to use the driver's"
        )  # fmt: skip
        folders = sorted({os.path.dirname(b.path) for b in found.binds if b.path in sonames})
        env.setdefault("LD_LIBRARY_PATH", ":".join(folders))
    if libc_dir is None:
        notes.append("the container has no libc.so.6 in a default linker directory")
    if found.ignored_mounts:
        notes.append(
            "not bound, not a driver library, tool or firmware: " + ", ".join(found.ignored_mounts)
        )
    return DriverPlan(found.binds + links, env, found.origin, found.ignored_hooks, notes)
