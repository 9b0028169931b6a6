"""Holder pods: the pods that make the kubelet count a GPU mounted by count.

A holder asks the scheduler for `count` GPUs on this node and is given some; the
container gets those same GPUs hot-mounted, and the holder stands for them in the
kubelet's books for as long as the mount lasts. Here: the manifest, creating one and
waiting for it to run, releasing it after an unmount, and the two repairs reconcile
makes (holders no mount accounts for; mounts whose holder is gone).
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections import defaultdict
from collections.abc import Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from enum import StrEnum

from agent.books.turns import Turns
from agent.common.intents import Intents
from agent.common.locks import ContainerLocks
from agent.common.results import require_kube, unclassified_text
from agent.config import AgentSettings
from agent.errors import ApiError, Timeout, Unschedulable
from agent.kube.client import KubeClient, PodInfo, owner_reference
from agent.kube.dra import ResourceApi
from hotmount.api import ContainerRecord, Engine, HotmountError

log = logging.getLogger(__name__)

HOLDER_PREFIX = "hotmount-holder-"
PIN_PREFIX = "hotmount-pin-"
BLOCKER_PREFIX = "hotmount-blocker-"
HOLDER_LABEL = "hotmount.io/holder-for"
MANAGED_BY = ("app.kubernetes.io/managed-by", "gpu-hotmount")
HOLDER_SELECTOR = f"{MANAGED_BY[0]}={MANAGED_BY[1]},{HOLDER_LABEL}"
RELEASE_POLL = 0.05  # seconds between two looks at a deleted holder (an unmount waits)


# Guaranteed QoS (requests equal limits for cpu and memory): never the first pod the
# kubelet evicts under node pressure. The pause container needs well under a MiB.
HOLDER_CPU = "10m"
HOLDER_MEMORY = "16Mi"
ROLE_LABEL = "hotmount.io/role"
DEVICE_ANNOTATION = "hotmount.io/device"


class Role(StrEnum):
    """A count holder stands for GPUs mounted by count; a pin for one GPU mounted by
    name; a blocker holds a free GPU for a moment while a pin is made (in the agent's own
    namespace, owned by the agent's pod: agent/books/plugin_pins.py)."""

    COUNT = "count"
    PIN = "pin"
    BLOCKER = "blocker"


def holder_priority_class(settings: AgentSettings, target: PodInfo) -> str | None:
    """The target's own class where the operator allows it, else the fallback, else none.

    A pin of lower priority than its pod could be preempted by any GPU pod, and reconcile
    would then take the GPU back from the tenant; but the admission policy refuses every
    class not listed (one could preempt anything), so an unlisted class is never sent.

    A holder's or pin's preemptionPolicy is its class's: a pod cannot choose its own (the
    Priority admission plugin refuses a pod whose preemptionPolicy differs from the one
    its class gives, PreemptLowerPriority without a class). So a holder or pin may preempt
    what a pod of its target's class may, which the tenant's own GPU pod could do too: it
    stands for GPUs the tenant asked for, charged to the tenant's namespace's quota, and a
    pin is made only for a GPU the kubelet counts free. An operator who wants them never
    to preempt lists classes of preemptionPolicy Never. Blockers differ: they are the
    agent's, in its own namespace, charged to no quota; they take no tenant's class
    (`blocker_priority_class`).
    """
    fallback = settings.holder_priority_class
    allowed = {*settings.holder_priority_classes, *([fallback] if fallback else [])}
    if target.priority_class_name in allowed:
        return target.priority_class_name
    return fallback


def holder_manifest(
    settings: AgentSettings,
    target: PodInfo,
    name: str,
    count: int,
    role: Role = Role.COUNT,
    device: str | None = None,
) -> dict[str, object]:
    """A pod that requests `count` GPUs on the target's node, in its namespace (so the
    namespace's ResourceQuota charges it), as hard to evict or preempt as the target."""
    resource = settings.gpu_resource
    amounts = {resource: str(count), "cpu": HOLDER_CPU, "memory": HOLDER_MEMORY}
    spec: dict[str, object] = {
        # metadata.name, not the hostname label: on many clouds the two differ.
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {
                            "matchFields": [
                                {
                                    "key": "metadata.name",
                                    "operator": "In",
                                    "values": [target.node_name],
                                }
                            ]
                        }
                    ]
                }
            }
        },
        "tolerations": [{"operator": "Exists"}],
        "restartPolicy": "Always",
        "terminationGracePeriodSeconds": 0,
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "containers": [
            {
                "name": "holder",
                "image": settings.holder_image,
                "imagePullPolicy": "IfNotPresent",
                "resources": {"limits": dict(amounts), "requests": dict(amounts)},
                "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "none"}],
            }
        ],
    }
    if role is Role.BLOCKER and settings.blocker_priority_class:
        # A blocker preempts no pod: its class is of preemptionPolicy Never, and the pod
        # says so too, so that the Priority admission plugin refuses a blocker whose class
        # would let it preempt (the admission policy requires Never of every blocker).
        spec["priorityClassName"] = settings.blocker_priority_class
        spec["preemptionPolicy"] = "Never"
    elif priority_class := holder_priority_class(settings, target):
        spec["priorityClassName"] = priority_class
    if settings.holder_runtime_class:
        spec["runtimeClassName"] = settings.holder_runtime_class
    metadata: dict[str, object] = {
        "name": name,
        "namespace": target.namespace,
        "labels": {
            MANAGED_BY[0]: MANAGED_BY[1],
            HOLDER_LABEL: target.name,
            ROLE_LABEL: str(role),
        },
        "ownerReferences": [owner_reference(target)],
    }
    if device:
        metadata["annotations"] = {DEVICE_ANNOTATION: device}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


@dataclass(frozen=True)
class Holder:
    """A holder pod that is Running: the kubelet has given it its devices."""

    name: str
    uid: str


@dataclass(frozen=True)
class HolderPods:
    settings: AgentSettings
    engine: Engine
    kube: KubeClient | None
    locks: ContainerLocks
    intents: Intents  # what restarted containers are owed: their holders stay
    resources: ResourceApi | None = None  # DRA: a pin's ResourceClaim goes with it
    # Holder pods of mounts in progress: reconcile never takes them for orphans.
    _in_flight: set[tuple[str, str]] = field(default_factory=set, init=False, repr=False)
    _in_flight_guard: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)
    # When reconcile first saw each orphan-looking holder (monotonic, no clock skew).
    _orphans_seen: dict[tuple[str, str], float] = field(
        default_factory=dict, init=False, repr=False
    )

    turns: Turns = field(init=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "turns", Turns(self.settings.holder_timeout))

    def turn(self) -> AbstractContextManager[None]:
        """One holder-making mount at a time on this node (agent/books/turns.py)."""
        return self.turns.turn()

    @contextmanager
    def in_flight(self, namespace: str, names: Iterable[str]) -> Iterator[None]:
        """Reconcile takes none of these for orphans while the body runs. Leave only after
        the ledger holds the mount (or the pods are deleted): reconcile reads the holders,
        then this set, then the ledger, so it never sees a gap."""
        keys = {(namespace, name) for name in names}
        with self._in_flight_guard:
            self._in_flight.update(keys)
        try:
            yield
        finally:
            with self._in_flight_guard:
                self._in_flight.difference_update(keys)

    @staticmethod
    def new_name(target: PodInfo, role: Role = Role.COUNT) -> str:
        if role is Role.BLOCKER:
            return f"{BLOCKER_PREFIX}{secrets.token_hex(4)}"
        prefix = PIN_PREFIX if role is Role.PIN else HOLDER_PREFIX
        return f"{prefix}{target.name[:40]}-{secrets.token_hex(3)}"

    def delete(self, namespace: str, names: Iterable[str]) -> None:
        """Delete holder pods without waiting; a failure is logged (reconcile collects them)."""
        for name in names:
            try:
                self._delete_one(namespace, name)
            except ApiError as exc:
                log.warning("could not delete holder pod %s/%s: %s", namespace, name, exc.message)

    def _delete_one(self, namespace: str, name: str) -> None:
        """A holder pod, and a pin's ResourceClaim of the same name (DRA frees the GPU
        once no pod reserves the claim; the claim must not outlive its pin)."""
        require_kube(self.kube).delete_pod(namespace, name)
        if self.resources is not None and name.startswith(PIN_PREFIX):
            self.resources.delete_claim(namespace, name)

    @contextmanager
    def new(self, target: PodInfo, count: int) -> Iterator[Holder]:
        """A Running holder pod of `count` GPUs for `target`, for the body to mount its
        devices; deleted again if the body fails. Reconcile leaves it alone meanwhile."""
        name = self.new_name(target)
        with self.turn(), self.in_flight(target.namespace, [name]):
            kube = require_kube(self.kube)
            manifest = holder_manifest(self.settings, target, name, count)
            created = kube.create_pod(target.namespace, manifest)
            try:
                self.wait_running(target.namespace, name)
                yield Holder(name, created.uid)
            except BaseException:
                self.delete(target.namespace, [name])
                raise

    def wait_running(self, namespace: str, name: str) -> None:
        failure = self.wait_all_running(namespace, [name])[name]
        if failure is not None:
            raise failure

    def wait_all_running(self, namespace: str, names: list[str]) -> dict[str, ApiError | None]:
        """Wait, together, until each holder pod runs or cannot: None for a Running one,
        the reason for the others."""
        deadline = time.monotonic() + self.settings.holder_timeout
        outcome: dict[str, ApiError | None] = {}
        while True:
            for name in [n for n in names if n not in outcome]:
                pod = require_kube(self.kube).find_pod(namespace, name)
                if pod is None:
                    outcome[name] = Unschedulable(f"holder pod {namespace}/{name} disappeared")
                elif pod.phase == "Running":
                    outcome[name] = None
                elif pod.unschedulable_message:
                    outcome[name] = Unschedulable(
                        f"no room for {name}: {pod.unschedulable_message}"
                    )
                elif pod.phase in ("Failed", "Succeeded"):
                    outcome[name] = Unschedulable(f"holder pod {name} was rejected ({pod.phase})")
            if len(outcome) == len(names):
                return outcome
            if time.monotonic() > deadline:
                for name in names:
                    outcome.setdefault(
                        name,
                        Timeout(
                            f"holder pod {name} was not Running after "
                            f"{self.settings.holder_timeout:g}s"
                        ),
                    )
                return outcome
            time.sleep(0.2)

    def named_in(self, container_id: str) -> set[str]:
        """The holder pods the container's mounts name."""
        record = self.engine.mounts.record(container_id)
        if record is None:
            return set()
        return {h for d in record.devices.values() if (h := d.metadata.get("holder"))}

    def named_anywhere(self) -> set[str]:
        """Every holder pod a mount on this node names (a pin may serve several containers
        of its pod), or that waits for a restarted container (agent/node/remounts.py)."""
        return {
            h
            for record in self.engine.mounts.records()
            for d in record.devices.values()
            if (h := d.metadata.get("holder"))
        } | {holder for _, holder in self.intents.named_holders()}

    def release(self, namespace: str, before: set[str], wait: bool = True) -> list[str]:
        """Delete the holder pods none of whose devices is still mounted anywhere, and
        that no mount or move in progress holds; `wait` until they are gone, so that the
        kubelet has the GPUs free again on return."""
        named = self._named_or_in_flight()
        gone = sorted(h for h in before if (namespace, h) not in named)
        if self.kube is None or not gone:
            return []
        for pod in gone:
            self._delete_one(namespace, pod)
        if not wait:
            return gone
        deadline = time.monotonic() + self.settings.holder_timeout
        for pod in gone:
            while self.kube.find_pod(namespace, pod) is not None:
                if time.monotonic() > deadline:
                    raise Timeout(f"holder pod {pod} is still there after deletion")
                time.sleep(RELEASE_POLL)
        return gone

    def release_after(
        self, namespace: str | None, before: set[str], what: str, *, wait: bool
    ) -> list[str]:
        """`release` once the work is done (an idle reclaim or suspension, a take-back),
        with the container's lock no longer held: a pod that cannot be deleted now is
        logged, and reconcile collects it as an orphan later."""
        if not namespace:
            return []
        try:
            return self.release(namespace, before, wait=wait)
        except ApiError as exc:
            log.warning("%s: holder pod release: %s", what, exc.message)
            return []

    def _in_flight_now(self) -> set[tuple[str, str]]:
        with self._in_flight_guard:
            return set(self._in_flight)

    def _named_with_namespace(self) -> set[tuple[str, str]]:
        """(namespace, holder) of every holder and pin a mount or an intent names."""
        return {
            (d.metadata.get("namespace") or "", h)
            for record in self.engine.mounts.records()
            for d in record.devices.values()
            if (h := d.metadata.get("holder"))
        } | self.intents.named_holders()

    def _named_or_in_flight(self) -> set[tuple[str, str]]:
        """(namespace, holder) of the holders the ledger names or that are in flight, the
        set read both before and after the ledger: a mount leaves it only once the ledger
        names its holders, and a move enters it before its unmount stops naming its pin
        (agent/node/moves.py), so neither is ever in the gap between the two reads."""
        before = self._in_flight_now()
        named = self._named_with_namespace()
        return before | named | self._in_flight_now()

    def take_back_unheld(self) -> list[str]:
        """Unmount GPUs mounted by count whose holder pod is gone or finished.

        The holder is what the kubelet counts the GPU against, and it lives in the
        tenant's namespace, where the tenant may delete it. Without it the scheduler sees
        the GPU free and may give it to another tenant's pod while this container still
        has it: so the GPU goes (forced: the books are already wrong). The holder is
        known by its uid too: a new pod the tenant gives the same name stands in for
        nothing. Holders of mounts
        in progress are skipped; the ledger is read again under the container's lock, so
        a mount that came meanwhile, with a new holder, is left alone. A container whose
        lock another holds (a suspension runs) is skipped for this pass, never waited for.
        """
        if self.kube is None:
            return []
        in_flight = self._in_flight_now()
        taken = []
        for record in self.engine.mounts.records():
            by_holder: dict[tuple[str, str, str], list[str]] = defaultdict(list)
            for d in record.devices.values():
                namespace, holder = d.metadata.get("namespace"), d.metadata.get("holder")
                if namespace and holder and (namespace, holder) not in in_flight:
                    by_holder[(namespace, holder, d.metadata.get("holderUid", ""))].append(d.key)
            for (namespace, holder, uid), keys in by_holder.items():
                try:
                    pod = self.kube.find_pod(namespace, holder)
                except ApiError as exc:
                    log.warning("cannot read holder pod %s/%s: %s", namespace, holder, exc.message)
                    continue
                if (
                    pod is not None
                    and pod.phase not in ("Failed", "Succeeded")
                    and (not uid or pod.uid == uid)  # not another pod of the same name
                ):
                    continue  # still there (only its labels changed): the books are right
                ref = record.container_id or record.key
                result = None
                try:
                    with self.locks.try_hold(ref) as free:
                        if not free:
                            # A suspension (or another call) holds the container for as
                            # long as it runs; reconcile never waits on it (next pass).
                            log.debug("take-back of %s from %s: the container is busy", keys, ref)
                            continue
                        now = self.engine.mounts.record(record.key)
                        mine = [
                            k
                            for k in keys
                            if now
                            and k in now.devices
                            and now.devices[k].metadata.get("holder") == holder
                        ]
                        if mine:
                            # Forced: never waits on a complete look at the open files.
                            result = self.engine.unmount(ref, mine, force=True, spare_staying=False)
                except HotmountError as exc:
                    log.warning("cannot take back %s from %s: %s", keys, ref, exc.message)
                    continue
                if mine:
                    more = unclassified_text(result) if result else ""
                    log.warning(
                        "took %s back from %s: its holder pod %s/%s is gone, so the kubelet "
                        "counts it free%s",
                        ", ".join(mine),
                        ref,
                        namespace,
                        holder,
                        more,
                    )
                    self._tell_pod(record, namespace, mine, holder, more)
                    taken += mine
        return taken

    def _tell_pod(
        self, record: ContainerRecord, namespace: str, keys: list[str], holder: str, more: str
    ) -> None:
        """A Warning Event on the pod: a GPU taken from a tenant is never silent."""
        pod_name = record.devices[keys[0]].metadata.get("pod")  # the snapshot before
        if self.kube is None or not pod_name:
            return
        self.kube.event_on_pod(
            namespace,
            pod_name,
            "GPUTakenBack",
            f"took {', '.join(keys)} back: its pin or holder pod {holder} is gone, so the "
            f"kubelet counts the GPU free and may give it to another pod{more}",
            warning=True,
        )

    def collect_orphan_holders(self) -> list[str]:
        """Delete this node's holder pods that no live mount accounts for.

        A holder is kept while a ledger record (of a container the engine's reconcile
        just found alive) names it, in its namespace; its labels decide nothing here: the
        tenant may edit them, and a holder taken for an orphan frees its GPU in the
        kubelet's books while the container still has it. Others are deleted once
        they have looked orphaned for `holder_orphan_grace` seconds, so that a mount in
        progress in another agent process (a rolling update) is never hit; this
        process's own mounts and moves in progress are skipped outright. Order matters:
        holders are listed first, then the ledger is read between two reads of the
        in-flight set, so a mount that finishes, or a move that starts, in between is
        seen in the one or the other.
        """
        node = self.settings.node_name
        if self.kube is None or not node:
            return []
        try:
            listed = [h for h in self.kube.holder_pods(HOLDER_SELECTOR) if h.node == node]
        except ApiError as exc:
            log.warning("cannot list holder pods: %s", exc.message)
            return []
        accounted = self._named_or_in_flight()
        now = time.monotonic()
        seen: dict[tuple[str, str], float] = {}
        deleted = []
        for holder in listed:
            key = (holder.namespace, holder.name)
            target = holder.labels.get(HOLDER_LABEL)
            if key in accounted:
                continue
            first = self._orphans_seen.get(key, now)
            if now - first < self.settings.holder_orphan_grace:
                seen[key] = first
                continue
            try:
                self._delete_one(holder.namespace, holder.name)
            except ApiError as exc:
                log.warning("cannot delete orphan holder %s/%s: %s", *key, exc.message)
                seen[key] = first
                continue
            log.info(
                "deleted holder pod %s/%s: no live container of pod %s holds its devices",
                holder.namespace,
                holder.name,
                target,
            )
            deleted.append(f"{holder.namespace}/{holder.name}")
        self._orphans_seen.clear()
        self._orphans_seen.update(seen)
        return deleted
