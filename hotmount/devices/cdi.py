"""CDI specs (Container Device Interface, cdiVersion 0.3.0 to 0.8.0), device nodes only.

A spec names devices vendor-neutrally (`nvidia.com/gpu=0`); its
`containerEdits.deviceNodes` say which nodes each one needs. Spec-level edits
are shared by all of the spec's devices. Mounts, hooks and environment edits are
read by hotmount/driver/ when a mount brings the driver's files (docs/driver.md).
A device that needs a block device or a node outside /dev is refused, with
the reason kept so the caller hears why.
"""

from __future__ import annotations

import json
import logging
import os
import re
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from hotmount.devices.model import Device, DeviceKind, DeviceNode
from hotmount.hostfs import HostRoot

log = logging.getLogger(__name__)

SUPPORTED_VERSIONS = ("0.3.0", "0.4.0", "0.5.0", "0.6.0", "0.7.0", "0.8.0")
_KIND = re.compile(r"^[a-z0-9]([a-z0-9.-]*[a-z0-9])?/[a-zA-Z0-9]([a-zA-Z0-9_.-]*[a-zA-Z0-9])?$")
_NAME = re.compile(r"^[a-zA-Z0-9]([a-zA-Z0-9_.:-]*[a-zA-Z0-9])?$")


class CdiError(ValueError):
    """A spec or a device in it cannot be used."""


@dataclass(frozen=True)
class CdiResult:
    devices: list[Device]
    refused: dict[str, str]


def load_specs(host: HostRoot, directories: list[str]) -> CdiResult:
    devices: dict[str, Device] = {}
    refused: dict[str, str] = {}
    for directory in directories:
        spec_dir = host.path(directory)
        if not spec_dir.is_dir():
            continue
        for spec_path in sorted(spec_dir.iterdir()):
            if spec_path.suffix not in (".yaml", ".yml", ".json") or not spec_path.is_file():
                continue
            try:
                spec = _read(spec_path)
                parsed, bad = parse_spec(spec, lambda p: _stat_host_node(host, p))
            except CdiError as exc:
                log.warning("ignoring CDI spec %s: %s", spec_path, exc)
                continue
            for device in parsed:
                if device.key in devices:
                    log.warning("CDI device %s in %s overrides another spec", device.key, spec_path)
                devices[device.key] = device
                refused.pop(device.key, None)
            refused.update(bad)
    return CdiResult(list(devices.values()), refused)


def _read(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text()
    except OSError as exc:
        raise CdiError(f"unreadable: {exc}") from exc
    return parse(text, path.suffix)


def parse(text: str, suffix: str) -> dict[str, Any]:
    """A spec's text (JSON for `.json`, else YAML) as a mapping, or CdiError."""
    try:
        spec = json.loads(text) if suffix == ".json" else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as exc:
        raise CdiError(f"unreadable: {exc}") from exc
    if not isinstance(spec, dict):
        raise CdiError("not a mapping")
    return spec


StatNode = Callable[[str], tuple[str, int, int]]


def parse_spec(spec: dict[str, Any], stat_node: StatNode) -> tuple[list[Device], dict[str, str]]:
    """Turn one spec into devices; `stat_node(path)` returns (type, major, minor) from the host."""
    version = str(spec.get("cdiVersion", ""))
    if version not in SUPPORTED_VERSIONS:
        raise CdiError(f"cdiVersion {version!r} is not one of {', '.join(SUPPORTED_VERSIONS)}")
    kind = spec.get("kind")
    if not isinstance(kind, str) or not _KIND.match(kind):
        raise CdiError(f"kind {kind!r} is not vendor/class")
    try:
        shared = _nodes(spec.get("containerEdits"), stat_node)
    except CdiError as exc:
        raise CdiError(f"spec-level containerEdits: {exc}") from exc
    devices, refused = [], {}
    for entry in spec.get("devices") or []:
        name = entry.get("name") if isinstance(entry, dict) else None
        if not isinstance(name, str) or not _NAME.match(name):
            raise CdiError(f"device name {name!r} is invalid")
        qualified = f"{kind}={name}"
        try:
            own = _nodes(entry.get("containerEdits"), stat_node)
        except CdiError as exc:
            refused[qualified] = str(exc)
            continue
        if not own and not shared:
            refused[qualified] = "it has no device nodes"
            continue
        devices.append(Device(key=qualified, kind=DeviceKind.CDI, nodes=own, shared_nodes=shared))
    return devices, refused


def _nodes(edits: Any, stat_node: StatNode) -> tuple[DeviceNode, ...]:
    if not edits:
        return ()
    nodes = []
    for raw in edits.get("deviceNodes") or []:
        path = raw.get("path")
        if not isinstance(path, str):
            raise CdiError("a device node has no path")
        node_type, major, minor = raw.get("type"), raw.get("major"), raw.get("minor")
        if node_type is None or major is None or minor is None:
            found = stat_node(raw.get("hostPath") or path)
            node_type = node_type or found[0]
            major = found[1] if major is None else major
            minor = found[2] if minor is None else minor
        if node_type not in ("c", "u"):
            what = "a block device" if node_type == "b" else f"node type {node_type!r}"
            raise CdiError(f"{path} is {what}; only character devices are granted")
        try:
            nodes.append(
                DeviceNode(
                    path=path,
                    major=int(major),
                    minor=int(minor),
                    file_mode=_file_mode(raw.get("fileMode")),
                    permissions=raw.get("permissions") or "rw",
                )
            )
        except (TypeError, ValueError) as exc:
            raise CdiError(str(exc)) from exc
    return tuple(nodes)


def _file_mode(value: Any) -> int:
    if value is None:
        return 0o666
    mode = int(value, 8) if isinstance(value, str) else int(value)
    return stat.S_IMODE(mode)


def _stat_host_node(host: HostRoot, path: str) -> tuple[str, int, int]:
    try:
        st = os.stat(host.path(path))
    except OSError as exc:
        raise CdiError(
            f"{path}: no major/minor given and the host node is unreadable ({exc.strerror})"
        ) from exc
    if stat.S_ISCHR(st.st_mode):
        kind = "c"
    elif stat.S_ISBLK(st.st_mode):
        kind = "b"
    else:
        raise CdiError(f"{path} on the host is not a device node")
    return kind, os.major(st.st_rdev), os.minor(st.st_rdev)
