"""Rendering results as `-o table|json|yaml`, and the waiting indicator on stderr.

json and yaml print the agent's models exactly as they travel on the wire
(camelCase, every field), so a script sees the same document as an HTTP caller.
Tables are for people: one row per device. Their text came from agents (a missing
node's message, a pod's name, a holder), and an agent may be compromised: every control
and direction-changing character is printed as `?` (`printable`), so that no answer can
move the cursor, clear the screen or retitle the terminal. json and yaml escape them.

pydantic, the agent's models and yaml are imported when a result needs them, so that
`nvcli version` and `--help` start without them.
"""

from __future__ import annotations

import json
import re
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, TextIO

if TYPE_CHECKING:
    from hotmount.wire.schemas import (
        DeviceHolder,
        DeviceInfo,
        DeviceList,
        DriverAdded,
        MountResult,
        ReassignResult,
        UnmountResult,
    )

FORMATS = ("table", "json", "yaml")
# C0 and C1 controls (ESC, CSI, BEL, CR...), DEL, and the zero-width and bidirectional
# format characters (U+200B-200F, U+202A-202E, U+2066-2069, ...), newline kept apart.
_UNPRINTABLE = "\x00-\x09\x0b-\x1f\x7f-\x9f\u061c\u200b-\u200f\u2028-\u202e\u2060-\u2069\ufeff"
_UNPRINTABLE_LINE = re.compile(f"[{_UNPRINTABLE}]")
_UNPRINTABLE_CELL = re.compile(f"[\n{_UNPRINTABLE}]")


def printable(text: str) -> str:
    """`text` with every control and format character as `?`, newlines kept."""
    return _UNPRINTABLE_LINE.sub("?", text)


def _printable_cell(text: str) -> str:
    """One cell or line of a table: a newline would start a row of its own."""
    return _UNPRINTABLE_CELL.sub("?", text)


_PLAIN = (dict, str, int, float, bool, type(None))


def to_data(result: Any) -> Any:
    if isinstance(result, _PLAIN):
        return result
    if isinstance(result, list):
        return [to_data(item) for item in result]
    from pydantic import BaseModel

    if isinstance(result, BaseModel):
        return result.model_dump(mode="json", by_alias=True)
    return result


def render(result: Any, fmt: str) -> str:
    """The text to print for `result` in format `fmt`."""
    if fmt == "json":
        return json.dumps(to_data(result), indent=2)
    if fmt == "yaml":
        import yaml

        return yaml.safe_dump(to_data(result), sort_keys=False, default_flow_style=False).rstrip()
    return printable(table(result))


def table(result: Any) -> str:
    if isinstance(result, dict):
        return "\n".join(f"{k}: {v}" for k, v in result.items())
    from hotmount.wire.schemas import (
        DeviceList,
        MountResult,
        PodDevices,
        ReassignResult,
        UnmountResult,
    )

    if isinstance(result, MountResult):
        return mount_table(result)
    if isinstance(result, UnmountResult):
        return unmount_table(result)
    if isinstance(result, PodDevices):
        return status_table(to_data(result))
    if isinstance(result, ReassignResult):
        return move_table(result)
    if isinstance(result, list) and all(isinstance(r, DeviceList) for r in result):
        return devices_table(result)
    return str(result)


def columns(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """kubectl's layout: upper-case headers, columns padded to the widest cell plus 3."""
    cells = [
        [_printable_cell(str(c)) for c in header],
        *[[_printable_cell(_cell(c)) for c in row] for row in rows],
    ]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    return "\n".join(
        "   ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip() for row in cells
    )


def _cell(value: Any) -> str:
    if value is None or value in ("", []):
        return "<none>"
    if isinstance(value, list):
        return ",".join(str(v) for v in value)
    return str(value)


def _pod(namespace: str | None, pod: str | None) -> str:
    if pod is None:
        return "<none>"
    return f"{namespace}/{pod}" if namespace else pod


def _container(name: str | None, container_id: str) -> str:
    return name or container_id[:13] or "<none>"


def _where(namespace: str | None, pod: str | None, container: str | None, cid: str) -> str:
    return f"{_pod(namespace, pod)} container {_container(container, cid)}"


def holder_text(holder: DeviceHolder | Mapping[str, Any] | None) -> str:
    """A model or its JSON document (what `nvcli status` keeps)."""
    from hotmount.wire.tables import holder_text as text

    return text(holder if holder is None or isinstance(holder, Mapping) else to_data(holder))


def holders_text(
    holders: Sequence[DeviceHolder | Mapping[str, Any]],
    first: DeviceHolder | Mapping[str, Any] | None = None,
) -> str:
    """Everyone who holds one physical device (a shared GPU has several)."""
    every = holders or ([first] if first else [])
    return ", ".join(holder_text(h) for h in every) if every else holder_text(None)


def devices_table(listings: list[DeviceList]) -> str:
    rows = [
        [
            listing.node,
            d.index if d.index is not None else "-",
            d.key,
            kind_text(d),
            uuid_text(d),
            ",".join(d.aliases) or "-",
            nearest_text(d, listing),
            d.management or "-",
            holders_text(d.holders, d.holder),
        ]
        for listing in listings
        for d in listing.devices
    ]
    if not rows:
        return "No devices found."
    headers = [
        "NODE",
        "INDEX",
        "DEVICE",
        "KIND",
        "UUID",
        "ALIASES",
        "NEAREST",
        "BOOKS",
        "HELD BY",
    ]
    return columns(headers, rows) + queue_table(listings)


def queue_table(listings: list[DeviceList]) -> str:
    """The on-demand pods waiting for a GPU, below the devices (nothing when none waits)."""
    rows = [
        [listing.node, q.position, f"{q.namespace}/{q.pod}", q.model or "any",
         f"{q.waited_seconds:.0f}s", q.priority]
        for listing in listings
        for q in listing.queue
    ]  # fmt: skip
    if not rows:
        return ""
    headers = ["NODE", "PLACE", "WAITING POD", "MODEL", "WAITED", "PRIORITY"]
    return "\n\nWaiting for a GPU (on demand):\n" + columns(headers, rows)


def kind_text(device: DeviceInfo) -> str:
    """A MIG instance's kind with its profile (`mig 1g.10gb`) where NVML gave one."""
    if device.mig is not None and device.mig.profile:
        return f"{device.kind} {device.mig.profile}"
    return device.kind


def uuid_text(device: DeviceInfo) -> str | None:
    """A MIG instance read from /proc alone has no UUID: say why, not just `-`."""
    if device.uuid is None and device.mig is not None and device.mig.source == "procfs":
        return "<none: no NVML>"
    return device.uuid


def nearest_text(device: DeviceInfo, listing: DeviceList) -> str:
    """An RDMA device: the GPUs it is nearest (by index); a GPU: its nearest RDMA device."""
    if device.nearest_gpus:
        index = {d.key: d.index for d in listing.devices}
        return ",".join(
            str(index[k]) if index.get(k) is not None else k for k in device.nearest_gpus
        )
    return device.nearest_rdma or "-"


def status_table(doc: Mapping[str, Any]) -> str:
    """A `PodDevices` document (camelCase JSON): `nvcli status` renders the agent's reply
    as it came, without building the models."""
    namespace, pod = doc.get("namespace"), doc.get("pod")
    rows = [
        [
            _pod(namespace, pod),
            _container(c.get("container"), c.get("containerId") or ""),
            d["index"] if d.get("index") is not None else "-",
            d.get("key"),
            d.get("uuid"),
            d.get("paths"),
            holders_text(d["otherHolders"]) if d.get("otherHolders") else "-",
            d.get("pin") or "-",
            idle_text(d.get("idleSeconds"), d.get("idleTimeout")),
            d.get("state") or "mounted",
        ]
        for c in doc.get("containers") or []
        for d in c.get("devices") or []
    ]
    if not rows:
        return printable(f"No devices are hot-mounted in {_pod(namespace, pod)}.")
    headers = [
        "POD",
        "CONTAINER",
        "INDEX",
        "DEVICE",
        "UUID",
        "PATHS",
        "SHARED WITH",
        "PIN",
        "IDLE/TIMEOUT",
        "STATE",  # mounted, or suspended: given back, its processes kept (nvcli resume)
    ]
    return "\n".join([columns(headers, rows), *(_printable_cell(n) for n in idle_notes(doc))])


def idle_notes(doc: Mapping[str, Any]) -> list[str]:
    """One line under the table per warned mount (`GPUIdleSoon`), and per mount whose
    `unused` policy fell back to `unheld` (issue 20)."""
    notes = []
    for c in doc.get("containers") or []:
        container = _container(c.get("container"), c.get("containerId") or "")
        for d in c.get("devices") or []:
            gpu = f"GPU {d['index']}" if d.get("index") is not None else d.get("key")
            if d.get("reclaimInSeconds") is not None:
                when = reclaim_text(d["reclaimInSeconds"], d.get("idlePolicy"))
                notes.append(f"{gpu} in {container}: {when}")
            if d.get("idlePolicyNote"):
                notes.append(f"{gpu} in {container}: {d['idlePolicyNote']}")
    return notes


def reclaim_text(seconds: int, policy: str | None = None) -> str:
    """`reclaimed in 4m unless used` (a warned mount; `now` once due); under the idle
    policy `suspend`, `suspended in 4m unless used`: the GPU goes, the processes stay. A
    minute or more is rounded up to whole minutes: people read `4m`, not `3m59s`."""
    from hotmount.wire.durations import format_duration

    if seconds >= 60:
        seconds = -(-seconds // 60) * 60
    when = f"in {format_duration(seconds)}" if seconds > 0 else "now"
    taken = "suspended" if policy == "suspend" else "reclaimed"
    return f"{taken} {when} unless used"


def idle_text(seconds: int | None, timeout: str | None) -> str:
    """`12m/30m`: idle 12 minutes, taken back at 30; `busy/30m`: a process holds it;
    `-/never`: not looked at yet, and no idle timeout."""
    from hotmount.wire.durations import format_duration

    idle = "-" if seconds is None else "busy" if seconds == 0 else format_duration(seconds)
    return f"{idle}/{timeout or 'never'}"


def mount_table(result: MountResult) -> str:
    rows = [
        [d.index if d.index is not None else "-", d.key, state, d.paths, d.pin or "-"]
        for state, devices in (
            ("mounted", result.mounted),
            ("already mounted", result.already_mounted),
        )
        for d in devices
    ]
    where = _where(result.namespace, result.pod, result.container, result.container_id)
    lines = [columns(["INDEX", "DEVICE", "STATE", "PATHS", "PIN"], rows) if rows else "No devices."]
    lines.append(f"into {where}")
    for other in result.containers[1:]:  # the same devices, into every container asked for
        mounted = ", ".join(d.key for d in other.mounted + other.already_mounted) or "nothing"
        into = _where(result.namespace, result.pod, other.container, other.container_id)
        lines.append(f"and {mounted} into {into}")
    if result.holder_pod:
        lines.append(f"accounted by holder pod {result.namespace}/{result.holder_pod}")
    if result.netdevs:
        lines.append(f"network interfaces moved in: {', '.join(result.netdevs)}")
    if result.driver is not None:
        lines += driver_lines(result.driver)
    return "\n".join(lines)


def driver_lines(driver: DriverAdded) -> list[str]:
    """What came with the device, and the `export` lines a shell needs: a running
    process cannot be given an environment, so the caller sets it (docs/driver.md)."""
    import shlex

    lines = [f"driver files added: {len(driver.files)} from {driver.origin}"]
    lines += [f"note: {note}" for note in driver.notes]
    if driver.ignored_hooks:
        lines.append(f"hooks not applied: {', '.join(driver.ignored_hooks)}")
    if driver.env:
        lines.append("export in the pod's shells (new processes):")
        lines += [f"  export {k}={shlex.quote(v)}" for k, v in driver.env.items()]
    return lines


def unmount_table(result: UnmountResult) -> str:
    rows = [[key, "unmounted"] for key in result.unmounted]
    rows += [[key, "not mounted"] for key in result.not_mounted]
    where = _where(result.namespace, result.pod, result.container, result.container_id)
    lines = [columns(["DEVICE", "STATE"], rows) if rows else "Nothing was hot-mounted."]
    lines.append(f"from {where}")
    if result.stopped_pids:
        lines.append(f"stopped PIDs: {', '.join(str(p) for p in result.stopped_pids)}")
    if result.unclassified_pids:
        unclassified = ", ".join(str(p) for p in result.unclassified_pids)
        lines.append(
            f"  of which not looked at in full, stopped after the revoke: {unclassified} "
            f"({result.unclassified_why})"
        )
    if result.holder_pods_deleted:
        lines.append(f"holder pods deleted: {', '.join(result.holder_pods_deleted)}")
    if result.netdevs:
        lines.append(f"network interfaces given back: {', '.join(result.netdevs)}")
    if result.driver_removed:
        lines.append(f"driver files removed: {len(result.driver_removed)}")
    if result.driver_detached:
        lines.append(f"  still mapped, detached lazily: {', '.join(result.driver_detached)}")
    return "\n".join(lines)


def move_table(result: ReassignResult) -> str:
    src, dst = result.from_, result.to
    lines = [
        columns(
            ["DEVICE", "FROM", "TO"],
            [[result.device, _pod(src.namespace, src.pod), _pod(dst.namespace, dst.pod)]],
        )
    ]
    if result.unmounted.stopped_pids:
        stopped = ", ".join(str(p) for p in result.unmounted.stopped_pids)
        lines.append(f"stopped PIDs: {stopped}")
    paths = [p for d in result.mounted.mounted + result.mounted.already_mounted for p in d.paths]
    if paths:
        lines.append(f"paths in {_pod(dst.namespace, dst.pod)}: {', '.join(paths)}")
    return "\n".join(lines)


class Waiting:
    """A "waiting…" spinner on stderr while a call runs; silent unless stderr is a TTY.

    It appears only after `delay` seconds, so quick calls print nothing. `say(line)`
    prints a line above it (cli/progress.py's progress lines); `active`: on a TTY.
    """

    FRAMES = "|/-\\"

    def __init__(
        self,
        message: str,
        stream: TextIO | None = None,
        delay: float = 0.3,
        enabled: bool = True,
    ) -> None:
        """`enabled`: False for a command told to print its result alone (`-o json`)."""
        self.enabled = enabled
        self.message = message
        self.stream = stream or sys.stderr
        self.delay = delay
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._shown = False
        self._writing = threading.Lock()  # the spinner's frames and `say`'s lines

    @property
    def active(self) -> bool:
        return self._thread is not None

    def say(self, line: str) -> None:
        if not self.active:
            return
        with self._writing:
            self.stream.write(("\r\033[K" if self._shown else "") + printable(line) + "\n")
            self.stream.flush()

    def __enter__(self) -> Waiting:
        isatty = getattr(self.stream, "isatty", None)
        if self.enabled and isatty is not None and isatty():
            self._thread = threading.Thread(target=self._spin, daemon=True, name="nvcli-waiting")
            self._thread.start()
        return self

    def _spin(self) -> None:
        start = time.monotonic()
        if self._stop.wait(self.delay):
            return
        frame = 0
        while not self._stop.is_set():
            elapsed = int(time.monotonic() - start)
            with self._writing:
                self.stream.write(f"\r{self.FRAMES[frame % 4]} {self.message} ({elapsed}s)")
                self.stream.flush()
                self._shown = True
            frame += 1
            self._stop.wait(0.1)

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self._shown:
            self.stream.write("\r\033[K")
            self.stream.flush()
