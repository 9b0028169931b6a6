"""Pinning a device plugin's GPU: decided when the kubelet admits, charged for one GPU.

The kubelet cannot be asked for one device, only for a count, and it allocates devices
when it *admits* a pod, before any container starts; PodResources reports the
allocation from then on. So, within the node's turn (`HolderPods.turn`):

1. *blockers*, 1-GPU pods in the agent's own namespace (owned by the agent's pod, so no
   tenant's ResourceQuota pays for them), take every free GPU;
2. as soon as the kubelet has admitted them, the blocker given the wanted GPU is
   deleted: the wanted GPU is now the only free one;
3. the tenant's pin, in the target's namespace (its quota pays for exactly the GPUs it
   keeps), takes it; once PodResources lists the pin with the wanted GPU the books are
   right, and every blocker is deleted, beside the rest of the mount and a moment later
   (`BLOCKERS_LINGER`, cut short by the next turn): the mount answers without waiting
   for those deletions, and the next turn starts only once they are done
   (agent/books/turns.py). The pin goes on starting in the background; the
   mount does not wait for it to run.

Where the time goes (issue 42, 2 GPUs, a loaded 2-core node, medians): three
PodResources reads and a ResourceSlice list before the turn, 20 ms; creating the
blockers 30 ms; the kubelet admitting them 40-50 ms; deleting the one given the wanted
GPU 15-55 ms; creating the pin 20 ms; the kubelet admitting it 35-45 ms. Each blocker
costs an API create and delete, a scheduling cycle, an admission and a sandbox the
kubelet starts and stops again: with 8 GPUs, creating and admitting the blockers takes
250-330 ms instead of 80 ms.

No pod is ever bound by `nodeName`: the scheduler places every blocker and pin, so it
never hands the kubelet a pod the kubelet has no device for (`UnexpectedAdmissionError`);
an ordinary GPU pod created meanwhile waits Pending for a moment. Should such a pod be
scheduled onto the wanted GPU in the instant it is free, the attempt starts again (the
GPU is then that pod's, and the mount is refused as for any GPU the kubelet gave away).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TypeVar

from agent.books.holders import BLOCKER_PREFIX, Holder, HolderPods, Role, holder_manifest
from agent.books.kubelet import KubeletBooks
from agent.common.results import device_label, require_kube
from agent.config import AgentSettings
from agent.errors import ApiError, QuotaExceeded, Timeout, Unschedulable, UpstreamError
from agent.kube.client import KubeClient, PodInfo
from hotmount.api import Device, Engine

log = logging.getLogger(__name__)

ATTEMPTS = 3  # a GPU taken in the instant it was free: start again, at most this often
POLL = 0.02  # seconds between two reads of PodResources (the kubelet allows 100 a second)
API_EVERY = 0.25  # seconds between two reads of the pods themselves (failures only)
# Seconds the blockers stay once the pin holds its GPU, unless the next turn comes first:
# the mount's engine step, Event and answer (20-150 ms on a loaded node) go out before
# their deletions and the kubelet's teardown of their sandboxes take the CPUs.
BLOCKERS_LINGER = 0.25

T = TypeVar("T")
PodKey = tuple[str, str]  # (namespace, name)


class _Raced(Exception):
    """Another pod took a GPU the attempt counted on: start again."""


@dataclass(frozen=True)
class PluginPins:
    settings: AgentSettings
    engine: Engine
    kube: KubeClient | None
    kubelet: KubeletBooks
    holders: HolderPods
    # Blockers this process deleted that the kubelet may still list: the next turn waits
    # for them, so that it counts their GPUs free.
    _freeing: set[str] = field(default_factory=set, init=False, repr=False)
    _guard: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)
    _agent: dict[str, PodInfo] = field(default_factory=dict, init=False, repr=False)

    def pin(self, target: PodInfo, wanted: list[Device]) -> dict[str, Holder]:
        """A pin for each wanted device (by inventory key), holding exactly it in the
        kubelet's books. Call within the node's turn."""
        self._wait_freed()
        last = ""
        for attempt in range(ATTEMPTS):
            try:
                return self._attempt(target, wanted, again=attempt > 0)
            except _Raced as exc:
                last = str(exc)
                log.info("pinning for %s/%s again: %s", target.namespace, target.name, last)
        raise Unschedulable(f"{last}; retry")

    def _attempt(self, target: PodInfo, wanted: list[Device], again: bool) -> dict[str, Holder]:
        books = self.kubelet.gpu_books()
        labels = ", ".join(device_label(d) for d in wanted)
        held = {d.key: self._holder_of(d, books.given) for d in wanted}
        taken = {k: pod for k, pod in held.items() if pod is not None}
        if taken:
            key, (namespace, name) = next(iter(taken.items()))
            raise Unschedulable(
                f"the kubelet counts {key} as pod {namespace}/{name}'s, not free, so it "
                "cannot be pinned: a pod that is starting or terminating may hold it; retry, "
                "or pass force"
            )
        unoffered = [d for d in wanted if not self._covers(books.free, d)]
        if unoffered:
            raise Unschedulable(
                f"the kubelet counts {', '.join(device_label(d) for d in unoffered)} neither "
                f"free nor given (not offered as healthy {self.settings.gpu_resource}), so "
                "it cannot be pinned; retry, or pass force"
            )
        # Blockers only where other GPUs are free too: with the wanted ones alone free,
        # the pins take exactly them. Again after a pin got another GPU, the scheduler
        # saw one free that the kubelet did not count (a pod going, a GPU given under
        # another ID): blockers then hold whatever the scheduler hands out.
        blocking = len(books.free) > len(wanted) or again
        agent_ns = self.settings.agent_namespace
        count = len(books.free) if blocking else 0
        blockers = [self.holders.new_name(target, Role.BLOCKER) for _ in range(count)]
        names = [self.holders.new_name(target, Role.PIN) for _ in wanted]
        with (
            self.holders.in_flight(agent_ns, blockers),
            self.holders.in_flight(target.namespace, names),
        ):
            try:
                if blockers:
                    self._block(blockers, wanted)
                pins = self._make_pins(target, names, labels)
                try:
                    given = self._wait_given([(target.namespace, n) for n in names], fail=True)
                except _Unheld as exc:
                    raise _Raced(str(exc)) from exc
                kept = self._pick(wanted, pins, given, target.namespace)
                missing = [d for d in wanted if d.key not in kept]
                if missing:
                    raise _Raced(
                        f"the kubelet gave {', '.join(device_label(d) for d in missing)} to "
                        "none of the pins: another pod took it meanwhile"
                    )
            except BaseException:
                self.holders.delete(target.namespace, names)
                self._delete_blockers(blockers)
                raise
        # The books are right: the pins hold the wanted GPUs. The blockers go while the
        # mount goes on; the next turn waits for that (agent/books/turns.py).
        self._delete_blockers(blockers, later=True)
        log.info(
            "pinned %s for %s/%s (%d blocker(s))",
            ", ".join(f"{k} as {h.name}" for k, h in kept.items()),
            target.namespace,
            target.name,
            len(blockers),
        )
        return kept

    def _covers(self, keys: Iterable[str], device: Device) -> bool:
        """Whether one of these inventory keys is `device`'s physical GPU (or shares it)."""
        inventory = self.engine.inventory
        footprint = inventory.footprint(device)
        return any(
            (found := inventory.get(key)) is not None
            and inventory.footprint(found).overlaps(footprint)
            for key in keys
        )

    def _holder_of(self, device: Device, given: dict[PodKey, list[str]]) -> PodKey | None:
        """The pod the kubelet gave `device` (its physical GPU), or None where it is free."""
        return next((pod for pod, keys in given.items() if self._covers(keys, device)), None)

    def _block(self, names: list[str], wanted: list[Device]) -> None:
        """Blockers take every free GPU; the ones given a wanted GPU are deleted again,
        so that the wanted GPUs are the only free ones once the kubelet has admitted all."""
        agent_ns = self.settings.agent_namespace
        owner = self._agent_pod()
        _each(names, lambda n: self._create(agent_ns, holder_manifest(
            self.settings, owner, n, 1, Role.BLOCKER)))  # fmt: skip
        given = self._wait_given([(agent_ns, n) for n in names], fail=False)
        freeing = []
        for device in wanted:
            holder = self._holder_of(device, given)
            if holder is not None:
                freeing.append(holder[1])
            # else: none of the blockers got it: it is free, or another pod took it (the
            # pin then gets another GPU, or none, and the attempt starts again)
        _each(freeing, lambda n: require_kube(self.kube).delete_pod(agent_ns, n))

    def _make_pins(self, target: PodInfo, names: list[str], labels: str) -> list[Holder]:
        try:
            created = _each(names, lambda n: self._create(target.namespace, holder_manifest(
                self.settings, target, n, 1, Role.PIN)))  # fmt: skip
        except QuotaExceeded as exc:
            raise QuotaExceeded(
                f"namespace {target.namespace} has no room for the pin that keeps {labels} "
                f"in the scheduler's books: {exc.message}",
                exc.details,
            ) from exc
        return created

    def _create(self, namespace: str, manifest: dict[str, object]) -> Holder:
        return Holder(*require_kube(self.kube).create_holder(namespace, manifest))

    def _wait_given(self, pods: list[PodKey], fail: bool) -> dict[PodKey, list[str]]:
        """Until the kubelet has admitted each pod (PodResources lists its devices) or it
        cannot be: its devices, [] for one the scheduler found no room for or the kubelet
        rejected. `fail`: such a pod is an error instead (a pin must hold its GPU)."""
        deadline = time.monotonic() + self.settings.holder_timeout
        next_look = time.monotonic() + API_EVERY
        done: dict[PodKey, list[str]] = {}
        while True:
            given = self.kubelet.gpu_books(free=False).given
            for pod in pods:
                if pod not in done and given.get(pod):
                    done[pod] = given[pod]
            if len(done) == len(pods):
                return done
            now = time.monotonic()
            if now >= next_look:
                next_look = now + API_EVERY
                for pod in [p for p in pods if p not in done]:
                    problem = self._cannot_hold(pod)
                    if problem is not None and fail:
                        raise problem
                    if problem is not None:
                        done[pod] = []
                if len(done) == len(pods):
                    return done
            if now > deadline:
                late = ", ".join(name for ns, name in pods if (ns, name) not in done)
                raise Timeout(
                    f"the kubelet had not admitted {late} after {self.settings.holder_timeout:g}s"
                )
            time.sleep(POLL)

    def _cannot_hold(self, pod: PodKey) -> ApiError | None:
        found = require_kube(self.kube).find_pod(*pod)
        name = f"{pod[0]}/{pod[1]}"
        if found is None:
            return _Unheld(f"pod {name} disappeared")
        if found.unschedulable_message:
            return _Unheld(f"no room for {name}: {found.unschedulable_message}")
        if found.phase in ("Failed", "Succeeded"):
            return _Unheld(f"the kubelet rejected pod {name} ({found.phase})")
        return None

    def _pick(
        self,
        wanted: list[Device],
        pins: list[Holder],
        given: dict[PodKey, list[str]],
        namespace: str,
    ) -> dict[str, Holder]:
        """Which pin holds which wanted device (pins for several GPUs take them in any
        order: all of them were free, and only they)."""
        kept: dict[str, Holder] = {}
        for device in wanted:
            for pin in pins:
                if pin in kept.values():
                    continue
                if self._covers(given.get((namespace, pin.name), []), device):
                    kept[device.key] = pin
                    break
        return kept

    def _delete_blockers(self, names: Iterable[str], later: bool = False) -> None:
        """Delete blockers, now or (`later`) beside the caller, before the next turn;
        either way the next pin waits until the kubelet lists them no more."""
        names = list(names)
        if not names:
            return
        agent_ns = self.settings.agent_namespace
        with self._guard:
            self._freeing.update(names)

        def delete() -> None:
            _each(names, lambda n: self.holders.delete(agent_ns, [n]))

        if later:
            self.holders.turns.leave("deleting blockers", delete, delay=BLOCKERS_LINGER)
        else:
            delete()

    def _wait_freed(self) -> None:
        """Until the kubelet lists none of the blockers deleted before: this turn then
        counts their GPUs free, as the scheduler already does. Bounded by
        `--holder-timeout`; past it, this turn merely sees fewer GPUs free."""
        with self._guard:
            waiting = set(self._freeing)
        if not waiting:
            return
        agent_ns = self.settings.agent_namespace
        deadline = time.monotonic() + self.settings.holder_timeout
        while True:
            given = self.kubelet.gpu_books(free=False).given
            listed = {name for (ns, name) in given if ns == agent_ns and name in waiting}
            with self._guard:
                self._freeing.difference_update(waiting - listed)
            if not listed:
                return
            if time.monotonic() > deadline:
                log.warning("the kubelet still lists deleted blockers %s", ", ".join(listed))
                return
            time.sleep(POLL)

    def _agent_pod(self) -> PodInfo:
        """This node's agent pod, which owns the blockers (its namespace is theirs)."""
        found = self._agent.get("pod")
        if found is not None:
            return found
        node = self.settings.node_name or ""
        kube = require_kube(self.kube)
        pods = kube.pods_on_node(self.settings.agent_namespace, self.settings.agent_selector, node)
        running = [p for p in pods if p.phase == "Running"]
        if not running:
            raise UpstreamError(
                f"no Running agent pod on {node} in namespace {self.settings.agent_namespace} "
                f"({self.settings.agent_selector}): pinning a GPU needs it (it owns the "
                "blockers, and its namespace is theirs)"
            )
        self._agent["pod"] = running[0]
        return running[0]


class _Unheld(Unschedulable):
    """A blocker or pin that will hold no GPU (unschedulable, rejected, gone)."""


def is_blocker(namespace: str, name: str, settings: AgentSettings) -> bool:
    return namespace == settings.agent_namespace and name.startswith(BLOCKER_PREFIX)


def _each(items: list[str], action: Callable[[str], T]) -> list[T]:
    """`action` on every item at once (API calls: a few milliseconds each, in parallel);
    the first failure is raised once all have returned, with what succeeded undone by the
    caller (everything made here is in flight and deleted on failure)."""
    if len(items) <= 1:
        return [action(i) for i in items]
    with ThreadPoolExecutor(max_workers=min(len(items), 16)) as pool:
        futures = [pool.submit(action, i) for i in items]
    errors = [f.exception() for f in futures if f.exception() is not None]
    if errors:
        raise errors[0]  # type: ignore[misc]
    return [f.result() for f in futures]
