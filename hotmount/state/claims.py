"""Which claims collide: pure rules over *physical* devices, no I/O.

A GPU has many names (index, UUID, MIG instances, CDI names such as
`nvidia.com/gpu=0`, `=GPU-<uuid>`, `=all`), so exclusivity is decided on the
character numbers (major:minor) of a device's own nodes, never on its name.
Shared control nodes (`nvidiactl`, `nvidia-uvm`, ...) do not count.

A device's footprint has two parts:

- `exclusive`: numbers nobody else may hold at the same time: a GPU's own node,
  every node of a CDI device, a MIG instance's capability nodes;
- `touched`: the exclusive numbers plus those a device needs but shares with its
  siblings: a MIG instance's parent GPU node.

Two footprints overlap when one's exclusive numbers meet the other's touched
numbers. So two MIG instances of one GPU do not collide (they only touch the
parent), while each collides with the full GPU (whose node is exclusive to it),
in either direction; `=all` collides with every GPU it names.

Sharing on purpose (CUDA IPC needs two processes to see one GPU):

1. a claim never blocks its own container;
2. claims of the same group (the same pod) never block each other: one GPU may
   be mounted into several containers of a pod;
3. a claim of another group blocks, unless that group is in the *circle* of the
   request: the groups linked to the requester, or to the group it names in
   `share_with`, by explicit `share_with` links among the claims on the same
   physical device. So a third pod gets a shared GPU only by naming one of its
   current holders, and a link made for one GPU never opens another.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from hotmount.errors import DeviceClaimed

Number = tuple[int, int]


class Node(Protocol):
    """A device node as the rules read it (hotmount/devices/model.py's DeviceNode)."""

    @property
    def path(self) -> str: ...
    @property
    def major(self) -> int: ...
    @property
    def minor(self) -> int: ...


class Device(Protocol):
    """A device as the rules read it (hotmount/devices/model.py's Device): devices/
    builds footprints from this module, so it imports nothing of devices/ back."""

    @property
    def key(self) -> str: ...
    @property
    def index(self) -> int | None: ...
    @property
    def nodes(self) -> Sequence[Node]: ...
    @property
    def shared_nodes(self) -> Sequence[Node]: ...


# nvidiactl and nvidia-modeset: every CUDA program opens them, none owns them.
CONTROL_NUMBERS: frozenset[Number] = frozenset({(195, 255), (195, 254)})
_GPU_NODE = re.compile(r"^/dev/nvidia\d+$")
_MIG_CAPS = "/dev/nvidia-caps/"


@dataclass(frozen=True)
class Footprint:
    """The physical numbers a device holds; `unknown` overlaps everything."""

    exclusive: frozenset[Number] = frozenset()
    touched: frozenset[Number] = frozenset()
    unknown: bool = False

    def overlaps(self, other: Footprint) -> bool:
        if self.unknown or other.unknown:
            return True
        return bool(self.exclusive & other.touched or other.exclusive & self.touched)


UNKNOWN = Footprint(unknown=True)


def footprint(device: Device, ignore: frozenset[Number] = CONTROL_NUMBERS) -> Footprint:
    """A device's physical footprint. Its `shared_nodes` never count, nor `ignore`d numbers.

    A device with MIG capability nodes (an inventoried MIG instance, or a CDI device
    such as nvidia-ctk's `nvidia.com/gpu=0:1`) only touches its parent GPU's node.
    """
    ignored = ignore | {(n.major, n.minor) for n in device.shared_nodes}
    mig = any(n.path.startswith(_MIG_CAPS) for n in device.nodes)
    exclusive: set[Number] = set()
    touched: set[Number] = set()
    for node in device.nodes:
        number = (node.major, node.minor)
        if number in ignored:
            continue
        touched.add(number)
        if not (mig and _GPU_NODE.match(node.path)):
            exclusive.add(number)
    return Footprint(frozenset(exclusive), frozenset(touched))


@dataclass(frozen=True)
class Workload:
    """Who a mount is for, in the caller's terms (a pod's container). The engine stores
    it with each device and names it when it refuses someone else the same device (409);
    it never decides anything by it. A bare container (no pod) has none."""

    namespace: str | None = None
    pod: str | None = None
    container: str | None = None

    def fields(self) -> dict[str, str]:
        """The fields set, as the 409's `holders` entries and the claim files carry them."""
        return {k: v for k, v in vars(self).items() if v}


@dataclass(frozen=True)
class Claim:
    """One container's hold on one device.

    `group` is who may share it without asking (a pod, `namespace/name`; for a bare
    container, the container itself); `shared_with` the group it joined on purpose;
    `holder` says who it is in messages.
    """

    owner: str
    device: str
    group: str
    footprint: Footprint
    shared_with: str | None = None
    holder: Workload | None = None


def circle(start: Iterable[str], claims: Iterable[Claim]) -> set[str]:
    """The groups linked to `start` by `shared_with` links among `claims` (both ways)."""
    links: dict[str, set[str]] = {}
    for c in claims:
        if c.shared_with and c.shared_with != c.group:
            links.setdefault(c.group, set()).add(c.shared_with)
            links.setdefault(c.shared_with, set()).add(c.group)
    found = set(start)
    todo = list(found)
    while todo:
        for other in links.get(todo.pop(), ()):
            if other not in found:
                found.add(other)
                todo.append(other)
    return found


def blocking(new: Claim, claims: Iterable[Claim], share_with: str | None = None) -> list[Claim]:
    """The claims that stop `new` (empty: it may go ahead). See the module's rules."""
    overlapping = [
        c for c in claims if c.owner != new.owner and c.footprint.overlaps(new.footprint)
    ]
    allowed = circle([new.group, *([share_with] if share_with else [])], overlapping)
    return [c for c in overlapping if c.group not in allowed]


def joined(new: Claim, claims: Iterable[Claim], share_with: str | None) -> str | None:
    """What `new` records as its `shared_with`: the group named, else the link its pod
    already has on this device (so a second container of a sharing pod keeps the circle)."""
    if share_with:
        return share_with
    for c in claims:
        if c.group == new.group and c.shared_with and c.footprint.overlaps(new.footprint):
            return c.shared_with
    return None


def claimed_error(device: Device | None, blockers: list[Claim]) -> DeviceClaimed:
    """409 naming every holder: the container, the name it mounted, its pod."""
    holders = []
    for b in blockers:
        where = f"container {b.owner}"
        if b.holder is not None and b.holder.pod:
            where = (
                f"pod {b.holder.namespace}/{b.holder.pod} "
                f"(container {b.holder.container}, {b.owner[:12]})"
            )
        named = "an unreadable claim (reconcile repairs it)" if b.footprint.unknown else b.device
        holders.append((where, named, b))
    label = device_label(device) if device is not None else blockers[0].device
    held = "; ".join(f"{where} as {named}" for where, named, _ in holders)
    return DeviceClaimed(
        f"device {label} is the same physical device as one hot-mounted in {held}; "
        "unmount it there first, share it on purpose (shareWith), or force",
        blockers[0].owner,
        [
            {"containerId": b.owner, "device": b.device, **(b.holder.fields() if b.holder else {})}
            for _, _, b in holders
        ],
    )


def device_label(device: Device) -> str:
    return f"{device.index} ({device.key})" if device.index is not None else device.key
