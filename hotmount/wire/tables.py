"""Kubernetes Tables for the aggregated API: what `kubectl get` prints.

kubectl asks every list and get with `Accept: application/json;as=Table;v=v1;
g=meta.k8s.io, application/json`. An API that answers the plain object leaves kubectl
only NAME and AGE, and AGE is `<unknown>` without a creationTimestamp. A Table carries
its own column definitions (priority 0 always shown, 1 only with `-o wide`) and one row
per line of output, each with the object's metadata so that `-A` can add NAMESPACE.

Pure: rows are built from the objects' JSON (camelCase), which is also what other
nodes' agents answer a fan-out with, so local and remote objects print alike.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Literal

TABLE_GROUP = "meta.k8s.io"
TABLE_VERSIONS = ("v1", "v1beta1")  # what kubectl 1.20 and later ask for, in its order
IncludeObject = Literal["None", "Metadata", "Object"]


def table_version(accept: str | None) -> str | None:
    """The meta.k8s.io version of the first Table `accept` asks for, or None for JSON.

    kubectl lists its choices in preference order; a server takes the first it serves.
    """
    for media_range in (accept or "").split(","):
        kind, *params = (part.strip() for part in media_range.split(";"))
        if kind not in ("application/json", "*/*"):
            continue
        values = dict(p.partition("=")[::2] for p in params)
        if values.get("as") != "Table" or values.get("g") != TABLE_GROUP:
            continue
        if values.get("v") in TABLE_VERSIONS:
            return values["v"]
    return None


def human_duration(seconds: float) -> str:
    """Kubernetes' `duration.HumanDuration`, so AGE reads as kubectl prints it elsewhere."""
    s = int(seconds)
    if s < -1:
        return "<invalid>"
    if s < 120:
        return f"{max(s, 0)}s"
    minutes, hours, days = s // 60, s // 3600, s // 86400
    if minutes < 10:
        return f"{minutes}m{s % 60}s" if s % 60 else f"{minutes}m"
    if minutes < 180:
        return f"{minutes}m"
    if hours < 8:
        return f"{hours}h{minutes % 60}m" if minutes % 60 else f"{hours}h"
    if hours < 48:
        return f"{hours}h"
    if hours < 192:
        return f"{days}d{hours % 24}h" if hours % 24 else f"{days}d"
    if hours < 24 * 365 * 2:
        return f"{days}d"
    years = days // 365
    if hours < 24 * 365 * 8:
        return f"{years}y{days % 365}d" if days % 365 else f"{years}y"
    return f"{years}y"


def age(timestamp: str | None, now: datetime) -> str:
    if not timestamp:
        return "<unknown>"
    return human_duration((now - datetime.fromisoformat(timestamp)).total_seconds())


def pod_text(namespace: str | None, pod: str | None) -> str:
    if pod is None:
        return "<none>"
    return f"{namespace}/{pod}" if namespace else pod


def holder_text(holder: Mapping[str, Any] | None) -> str:
    """One holder of a device, from its JSON: `ns/pod (container) [source, pin P]`."""
    if holder is None:
        return "<free>"
    pod, container = holder.get("pod"), holder.get("container")
    who = pod_text(holder.get("namespace"), pod) if pod else (holder.get("containerId") or "")[:13]
    if container:
        who += f" ({container})"
    pin = f", pin {holder['pin']}" if holder.get("pin") else ""
    return f"{who} [{holder.get('source')}{pin}]"


def holders_text(
    holders: Sequence[Mapping[str, Any]], first: Mapping[str, Any] | None = None
) -> str:
    """Everyone who holds one physical device (a shared GPU has several)."""
    every = holders or ([first] if first else [])
    return ", ".join(holder_text(h) for h in every) if every else holder_text(None)


def _column(
    name: str, description: str, priority: int = 0, type: str = "string", format: str = ""
) -> dict[str, Any]:
    """A TableColumnDefinition; `format: name` marks the column kubectl sorts and
    `-o name` by, `type: date` the one it may re-render as an age."""
    return {
        "name": name,
        "type": type,
        "format": format,
        "description": description,
        "priority": priority,
    }


GPUMOUNT_COLUMNS = [
    _column("Name", "The pod the GPUs are hot-mounted into.", format="name"),
    _column("Container", "The containers that have them."),
    _column("GPUs", "Index and short UUID of each hot-mounted device."),
    _column("Idle", "Idle time over idle timeout: busy, 12m/30m, -/never."),
    _column("Shared", "The pod whose GPU this mount joined on purpose."),
    _column("Pin or holder", "The pod that keeps each GPU in the scheduler's books."),
    _column("Queue", "On demand: the pod's place in the node's queue for a GPU."),
    _column("Age", "Since the first of these mounts.", type="date"),
    _column("Node", "The node the pod runs on.", priority=1),
    _column("UUIDs", "Full UUIDs.", priority=1),
    _column("Devices", "Device keys, as the agent names them.", priority=1),
    _column("Paths", "Device nodes created in the containers.", priority=1),
    _column("State", "mounted, or suspended: the GPU given back, its processes kept.", priority=1),
]

NODEDEVICES_COLUMNS = [
    _column("Node", "The node.", format="name"),
    _column("GPU", "Index (GPUs), or the device's key."),
    _column("UUID", "The device's UUID."),
    _column("Held by", "Every pod that holds it, and through whom (kubelet, hotmount)."),
    _column("Managed", "Whose books it is in: device plugin, DRA, or none."),
    _column("Age", "Since this node's agent took its inventory.", type="date"),
    _column("Device", "The agent's key for it.", priority=1),
    _column("Kind", "gpu, mig, rdma, ...", priority=1),
    _column("PCI", "PCI bus ID.", priority=1),
    _column("NUMA", "NUMA node.", priority=1),
    _column("Aliases", "Other names it may be asked by.", priority=1),
]

_MANAGED = {"device-plugin": "device plugin", "dra": "DRA", "unmanaged": "none"}


def short_uuid(uuid: str | None) -> str:
    """`GPU-8c1f2e3a-...` as `8c1f2e3a`: enough to tell a node's GPUs apart."""
    if not uuid:
        return "-"
    return uuid.removeprefix("GPU-").removeprefix("MIG-")[:8]


def _joined(values: Iterable[str]) -> str:
    unique = list(dict.fromkeys(v for v in values if v))
    return ",".join(unique) or "-"


def _devices(status: Mapping[str, Any]) -> list[tuple[Mapping[str, Any], Mapping[str, Any]]]:
    return [(c, d) for c in status.get("containers") or [] for d in c.get("devices") or []]


def _idle(device: Mapping[str, Any]) -> str:
    seconds, timeout = device.get("idleSeconds"), device.get("idleTimeout")
    idle = "-" if seconds is None else "busy" if seconds == 0 else human_duration(seconds)
    return f"{idle}/{timeout or 'never'}"


def _keeper(device: Mapping[str, Any]) -> str:
    if device.get("pin"):
        return f"pin {device['pin']}"
    return f"holder {device['holder']}" if device.get("holder") else ""


def gpumount_cells(obj: Mapping[str, Any], now: datetime) -> list[Any]:
    status = obj.get("status") or {}
    devices = _devices(status)
    gpus = [
        (f"{d['index']} ({short_uuid(d.get('uuid'))})" if d.get("index") is not None else d["key"])
        + (" suspended" if d.get("state") == "suspended" else "")
        for _, d in devices
    ]
    return [
        obj["metadata"]["name"],
        _joined(c.get("container") or (c.get("containerId") or "")[:13] for c, _ in devices),
        _joined(gpus),
        _joined(_idle(d) for _, d in devices),
        _joined(d.get("sharedWith") or "" for _, d in devices),
        _joined(_keeper(d) for _, d in devices),
        f"{status['queued']} in line" if status.get("queued") else "-",
        age(obj["metadata"].get("creationTimestamp"), now),
        status.get("node") or "-",
        _joined(d.get("uuid") or "" for _, d in devices),
        _joined(d["key"] for _, d in devices),
        _joined(p for _, d in devices for p in d.get("paths") or []),
        _joined(d.get("state") or "mounted" for _, d in devices),
    ]


def nodedevices_rows(obj: Mapping[str, Any], now: datetime) -> list[list[Any]]:
    status = obj.get("status") or {}
    node = obj["metadata"]["name"]
    created = age(obj["metadata"].get("creationTimestamp"), now)
    return [
        [
            node,
            str(d["index"]) if d.get("index") is not None else d["key"],
            d.get("uuid") or "-",
            holders_text(d.get("holders") or [], d.get("holder")),
            _MANAGED.get(d.get("management") or "", d.get("management") or "-"),
            created,
            d["key"],
            d.get("kind") or "-",
            d.get("pciBusId") or "-",
            str(d["numaNode"]) if d.get("numaNode") is not None else "-",
            ",".join(d.get("aliases") or []) or "-",
        ]
        for d in status.get("devices") or []
    ]


def _row_object(obj: Mapping[str, Any], include: IncludeObject, version: str) -> Any:
    if include == "None":
        return None
    if include == "Object":
        return obj
    return {
        "kind": "PartialObjectMetadata",
        "apiVersion": f"{TABLE_GROUP}/{version}",
        "metadata": obj["metadata"],
    }


def table(
    kind: str,
    objects: Sequence[Mapping[str, Any]],
    version: str,
    include: IncludeObject = "Metadata",
    now: datetime | None = None,
) -> dict[str, Any]:
    """The Table of `objects` (GPUMount or NodeDevices JSON) for kubectl to print."""
    now = now or datetime.now(UTC)
    if kind == "GPUMount":
        columns = GPUMOUNT_COLUMNS
        lines = [(obj, gpumount_cells(obj, now)) for obj in objects]
    else:
        columns = NODEDEVICES_COLUMNS
        lines = [(obj, cells) for obj in objects for cells in nodedevices_rows(obj, now)]
    return {
        "kind": "Table",
        "apiVersion": f"{TABLE_GROUP}/{version}",
        "metadata": {"resourceVersion": ""},
        "columnDefinitions": columns,
        "rows": [
            {"cells": cells, "object": _row_object(obj, include, version)} for obj, cells in lines
        ],
    }
