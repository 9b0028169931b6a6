"""On-demand GPUs at run time (issue 42): who holds a GPU now, who waits, and the thread
that hands GPUs over.

A pod annotated `hotmount.io/gpu-on-demand` (policy.py) holds a GPU only while its cells
run. Its notebook calls `acquire` before a cell and `release` after it:

- **acquire**: a GPU already attached answers at once. Otherwise the pod takes its place
  in the node's fair queue (queue.py; asking again keeps it) and the call waits up to
  `waitSeconds` for the hand-over thread to serve it, then answers its place.
- **release**: the cell ended: the GPU is suspended after the pod's idle time unless
  another cell comes (no warning first: the next cell resumes it). `leave`: the caller
  stopped waiting; its place goes at once.

The hand-over thread (`_run`) plans who gets which GPU (planning.py: in each model's
order, a free GPU first, else that of the on-demand pod idle longest past the minimum
hold, never one whose cell runs) and hands each hand-over to one of WORKERS threads
(handover.py's steps: the victim suspended, then the waiter resumed onto any free GPU
of its model or mounted by name, each pinned as a mount by name is). It also suspends
GPUs idle past their time, drops waiters that stopped asking (a closed notebook), and
counts GPU-seconds. So however many cells ask, at most WORKERS on-demand mounts run at
once; a waiting call takes no mutating slot (agent/http/guard.py) and at most
MAX_BLOCKED of them wait on a worker thread. A pod being resumed or suspended is
`moving`: nothing else starts on it until that ends.

The books follow the GPU: a suspend deletes the pin (and with it the quota charge), a
resume pins the GPU resumed onto, so an ordinary pod is never given, or refused for, a GPU
a notebook does not hold now. State lives in memory: after an agent restart a pod's next
acquire finds its mounts and suspensions in the ledger and carries on.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from agent.common.targets import Targets
from agent.config import AgentSettings
from agent.errors import (
    ApiError,
    BadRequest,
    PinRefused,
    QuotaExceeded,
    TooManyRequests,
)
from agent.kube.client import PodInfo
from agent.metrics import OnDemandMetrics
from agent.ondemand import planning, policy
from agent.ondemand.handover import HandOver, Tracked
from agent.ondemand.planning import HandOverTask, taken
from agent.ondemand.queue import (
    FairQueue,
    QueueRefused,
    estimate,
    ordinal,
)
from hotmount.api import Candidate, Engine, HotmountError
from hotmount.wire.ondemand import (
    AcquireRequest,
    AcquireResult,
    QueuedRequest,
    ReleaseRequest,
    ReleaseResult,
)

log = logging.getLogger(__name__)

TICK = 0.5  # seconds between the hand-over thread's looks when nothing wakes it
LEASE = 30.0  # a waiter that has not asked again for this long stopped waiting
HOLDS_KEPT = 32  # recent holds the estimate is the median of
MAX_BLOCKED = 16  # acquire calls that may wait on a worker thread at once (of the 40)
WORKERS = 4  # hand-overs (suspends, resumes, first mounts) under way at once
FREE_TTL = 2.0  # seconds the free GPUs, as read, stand for planning when nothing ended
RETRY_AFTER = 2.0  # seconds a caller answered at once, past MAX_BLOCKED, waits to ask again
REFUSED_BACKOFF = 30.0  # seconds a pod whose suspend was refused is not suspended again


@dataclass
class Arbiter:
    settings: AgentSettings
    engine: Engine
    metrics: OnDemandMetrics
    targets: Targets
    handover: HandOver
    clock: Callable[[], float] = time.monotonic
    queue: FairQueue = field(init=False)
    _pods: dict[tuple[str, str], Tracked] = field(default_factory=dict)
    _holds: collections.deque[float] = field(
        default_factory=lambda: collections.deque(maxlen=HOLDS_KEPT)
    )
    _cond: threading.Condition = field(default_factory=threading.Condition)
    _thread: threading.Thread | None = None
    _counted_at: float | None = None
    _blocked: int = 0  # acquire calls waiting on a worker thread now
    _workers: ThreadPoolExecutor | None = None
    _reserved: set[str] = field(default_factory=set)  # GPUs planned for hand-overs under way
    _free: list[Candidate] = field(default_factory=list)  # the last read of the free GPUs
    _free_at: float = float("-inf")
    _changed: bool = True  # a hand-over or suspend ended since that read

    def __post_init__(self) -> None:
        self.queue = FairQueue(
            self.settings.on_demand_per_caller, self.settings.on_demand_queue_limit
        )
        self.metrics.queue_length.set_function(lambda: len(self.queue))

    # -- the calls ----------------------------------------------------------------------

    def acquire(
        self, namespace: str, pod: str, request: AcquireRequest, caller: str,
        found: PodInfo | None = None,
    ) -> AcquireResult:  # fmt: skip
        """The pod's GPU, attached now or within `waitSeconds`; else its place in line
        (kept by the pod: asking again, with or without the ticket, is not a new place).

        The call never mounts or resumes itself: it joins the queue and the hand-over
        thread serves it (at once, when a GPU of its model is free and nobody is ahead).
        So at most WORKERS on-demand mounts run at once however many cells ask, and a
        waiting call holds a worker thread only while fewer than MAX_BLOCKED calls wait;
        past that it answers at once, with `retryAfterSeconds`."""
        tracked = self._track(namespace, pod, request.container, caller, found)
        self._ensure_thread()
        now = self.clock()
        with self._cond:
            tracked.busy, tracked.idle_since, tracked.last_asked = True, None, now
            if tracked.asked_at is None:
                tracked.asked_at = now
            return self._look(tracked, tracked.leaves, now + request.wait_seconds)

    def _look(self, tracked: Tracked, leaves: int, deadline: float) -> AcquireResult:
        """Under the lock, until `deadline`: attached, or the place in line. A place given
        up meanwhile (Ctrl-C while this call waited) ends the call: it never queues again.
        A refusal the hand-over met for this pod (its quota full) is raised."""
        blocked = False
        try:
            while True:
                if tracked.failure is not None:
                    failure, tracked.failure = tracked.failure, None
                    tracked.asked_at = None
                    raise failure
                if tracked.leaves != leaves:
                    return self._waiting(tracked, "stopped waiting: the place was given up")
                if not tracked.moving:
                    held = self.handover.held(tracked)
                    if held:
                        return self._attached(tracked, held)
                    if tracked.ticket is None:
                        self._join(tracked, self.clock())
                    self._cond.notify_all()  # the hand-over thread looks now
                remaining = deadline - self.clock()
                if remaining <= 0:
                    return self._waiting(tracked)
                if not blocked:
                    if self._blocked >= MAX_BLOCKED:
                        return self._waiting(tracked, retry_after=RETRY_AFTER)
                    self._blocked, blocked = self._blocked + 1, True
                self._cond.wait(min(remaining, TICK))
        finally:
            if blocked:
                self._blocked -= 1

    def release(
        self, namespace: str, pod: str, request: ReleaseRequest, caller: str,
        found: PodInfo | None = None,
    ) -> ReleaseResult:  # fmt: skip
        """The cell ended (its GPU suspended after the idle time), or with `leave`, the
        caller stopped waiting (its place given up now)."""
        with self._cond:
            tracked = self._pods.get((namespace, pod))
            if tracked is None:
                known = "no on-demand cell of this pod is known here"
                return ReleaseResult(namespace=namespace, pod=pod, state="unknown", message=known)
            tracked.busy, tracked.idle_since = False, self.clock()
            if request.leave and tracked.ticket is not None:
                self.queue.leave(tracked.ticket)
                tracked.ticket, tracked.asked_at = None, None
                tracked.leaves += 1
                self._cond.notify_all()
                left = "stopped waiting for a GPU; the place is given up"
                return ReleaseResult(namespace=namespace, pod=pod, state="left", message=left)
            idle = self._idle_of(tracked)
            return ReleaseResult(
                namespace=namespace, pod=pod, state="idle",
                message=f"the GPU is suspended after {idle:g}s without a cell",
            )  # fmt: skip

    def queued(self) -> list[QueuedRequest]:
        """Every place in the node's queue, in arrival order, each with its place among
        the waiters for its model."""
        with self._cond:
            now = self.clock()
            return [
                QueuedRequest(
                    namespace=r.namespace,
                    pod=r.pod,
                    model=r.model or None,
                    position=self.queue.position(r.ticket) or 0,
                    waited_seconds=round(now - r.since, 1),
                    priority=r.priority,
                )
                for r in self.queue.waiting()
            ]

    # -- state of one pod ---------------------------------------------------------------

    def _track(
        self, namespace: str, pod: str, container: str | None, caller: str,
        found: PodInfo | None,
    ) -> Tracked:  # fmt: skip
        info, chosen = self.targets.container(namespace, pod, container, found)
        try:
            wants = policy.on_demand_of(info.annotations)
        except ValueError as exc:
            raise BadRequest(str(exc)) from exc
        if wants is None:
            raise BadRequest(
                f"pod {namespace}/{pod} does not ask for on-demand GPUs: annotate it "
                f'{policy.ANNOTATION}: "1" (docs/notebooks.md)'
            )
        assert chosen.container_id is not None
        with self._cond:
            tracked = self._pods.get((namespace, pod))
            if tracked is None or tracked.container_id != chosen.container_id:
                tracked = Tracked(info, chosen.name, chosen.container_id, caller, wants,
                                  wants.model or "")  # fmt: skip
                self._pods[(namespace, pod)] = tracked
            tracked.info, tracked.caller, tracked.wants = info, caller, wants
            if not tracked.model:
                tracked.model = self.handover.suspended_model(tracked) or wants.model or ""
            return tracked

    def _idle_of(self, tracked: Tracked) -> float:
        return tracked.wants.idle or self.settings.on_demand_idle

    def _join(self, tracked: Tracked, now: float) -> None:
        namespace, pod = tracked.key
        try:
            request = self.queue.join(namespace, pod, tracked.caller, tracked.model, now,
                                      tracked.wants.priority)  # fmt: skip
        except QueueRefused as exc:
            self.metrics.refused.labels("TooManyRequests").inc()
            tracked.asked_at = None
            raise TooManyRequests(exc.message, retry_after=int(LEASE)) from exc
        tracked.ticket = request.ticket

    def _attached(self, tracked: Tracked, held: list[str]) -> AcquireResult:
        """The answer of a pod with its GPU: what the resume that gave it did, once."""
        now = self.clock()
        resumed, tracked.resumed = tracked.resumed, {}
        if tracked.attached_at is None:
            tracked.attached_at = now
        waited = now - tracked.asked_at if tracked.asked_at is not None else 0.0
        if tracked.asked_at is not None:
            self.metrics.wait.observe(waited)
        tracked.asked_at = None
        namespace, pod = tracked.key
        return AcquireResult(
            namespace=namespace, pod=pod, container=tracked.container, state="attached",
            devices=held, resumed=resumed, waited_seconds=round(waited, 3),
            message=f"GPU {', '.join(held)} attached",
        )  # fmt: skip

    def _waiting(
        self, tracked: Tracked, why: str | None = None, retry_after: float | None = None
    ) -> AcquireResult:
        namespace, pod = tracked.key
        place = self.queue.position(tracked.ticket) if tracked.ticket else None
        waited = self.clock() - (tracked.asked_at or self.clock())
        if place is None:  # being resumed or suspended right now, or given up
            return AcquireResult(
                namespace=namespace, pod=pod, container=tracked.container, state="waiting",
                waited_seconds=round(waited, 1), retry_after_seconds=retry_after,
                message=why or "waiting for a GPU: being handed over",
            )  # fmt: skip
        guess = estimate(place, self.handover.gpu_count(), list(self._holds))
        about = f", about {guess:.0f}s" if guess is not None else ""
        return AcquireResult(
            namespace=namespace, pod=pod, container=tracked.container, state="waiting",
            ticket=tracked.ticket, position=place, estimate_seconds=guess,
            waited_seconds=round(waited, 1), retry_after_seconds=retry_after,
            message=f"waiting for a GPU: {ordinal(place)} in line{about}",
        )  # fmt: skip

    # -- handing GPUs over -------------------------------------------------------------

    def _suspend(self, tracked: Tracked, why: str) -> bool:
        """Suspend the pod's GPUs (its processes kept); whether it was done. The caller set
        `moving`; a refusal leaves the GPU attached and the pod's idle clock restarted."""
        namespace, pod = tracked.key
        try:
            self.handover.suspend(tracked, why)
        except (ApiError, HotmountError) as exc:
            log.warning("on-demand suspend of %s/%s (%s) refused: %s", namespace, pod, why, exc)
            with self._cond:  # not tried again, for the idle time nor a waiter, for a while
                tracked.idle_since = self.clock()
                tracked.refused_until = self.clock() + REFUSED_BACKOFF
            return False
        with self._cond:
            if tracked.attached_at is not None:
                self._holds.append(self.clock() - tracked.attached_at)
            tracked.attached_at = None
        return True

    def _ensure_thread(self) -> None:
        with self._cond:
            if self._thread is None or not self._thread.is_alive():
                self._workers = ThreadPoolExecutor(WORKERS, thread_name_prefix="on-demand")
                self._thread = threading.Thread(target=self._run, name="on-demand", daemon=True)
                self._thread.start()

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait(TICK)
            try:
                self.step()
            except Exception:
                log.exception("on-demand hand-over pass failed; the next one tries again")

    def step(self) -> None:
        """One pass of the hand-over thread: plan who gets which GPU now and hand each
        hand-over to a worker (at most WORKERS at once); suspend GPUs idle past their
        time. Nothing here waits on a mount or a suspend."""
        now = self.clock()
        self._count(now)
        self._drop_abandoned(now)
        assert self._workers is not None
        for task in self._plan(now):
            self._workers.submit(self._hand_over, task)
        for tracked in self._due(now):
            self._workers.submit(self._idle_suspend, tracked)

    def _plan(self, now: float) -> list[HandOverTask]:
        """The hand-overs to start now (planning.py), their waiters and victims marked
        `moving` and their GPUs reserved until each ends."""
        with self._cond:
            head = next(iter(self.queue.waiting()), None)
            waiter = self._pods.get((head.namespace, head.pod)) if head else None
            if waiter is None:
                return []
            reserved = set(self._reserved)
        free = [g for g in self._free_gpus(waiter, now) if g.key not in reserved]
        with self._cond:
            lines = [
                [(t, r.ticket) for r in self.queue.order(model)
                 if (t := self._pods.get((r.namespace, r.pod))) and t.ticket == r.ticket]
                for model in sorted({r.model for r in self.queue.waiting()})
            ]  # fmt: skip
            victims = planning.victims(self._pods.values(), now, self.settings.on_demand_min_hold)
            tasks = planning.plan(lines, free, victims, self.handover.held)
            for task in tasks:
                for tracked in (task.waiter, *task.victims):
                    tracked.moving = True
                self._reserved.update(task.keys)
            return tasks

    def _free_gpus(self, waiter: Tracked, now: float) -> list[Candidate]:
        """The free GPUs, read again after a hand-over or a suspend ended and at most once
        a FREE_TTL otherwise: each read asks the kubelet's PodResources once per GPU, and
        the kubelet allows all its clients 100 calls a second. A waiter holds no GPU, so
        what the kubelet gave any pod is taken for all of them. A GPU taken since the last
        read fails its hand-over as taken, and is tried again after the next one."""
        with self._cond:
            fresh = not self._changed and now - self._free_at < FREE_TTL
            self._changed = False
        if not fresh:
            self._free, self._free_at = self.handover.free(waiter), now
        return list(self._free)

    def _hand_over(self, task: HandOverTask) -> None:
        """On a worker: suspend the victims, then attach the waiter onto the GPUs planned.
        A GPU taken meanwhile leaves the waiter in line for the next pass; a refusal (its
        quota full) takes it out of the line with the reason."""
        waiter = task.waiter
        try:
            if not all(self._suspend(victim, "waiter") for victim in task.victims):
                return
            try:
                resumed = self.handover.attach(waiter, task.keys)
            except (ApiError, HotmountError) as exc:
                if not taken(exc):
                    self._fail(waiter, task.ticket, exc)
                return
            with self._cond:
                self.queue.serve(task.ticket)
                waiter.ticket, waiter.resumed = None, resumed
                waiter.model = waiter.model or task.model
                # attached now, whether or not its call is still there to see it: counted,
                # and suspended after its idle time if the caller gave up meanwhile
                waiter.attached_at = self.clock()
            log.info("on-demand: %s/%s served (%s)", *waiter.key, resumed or "first GPU")
        except Exception:
            log.exception("on-demand hand-over to %s/%s failed", *waiter.key)
        finally:
            with self._cond:
                for tracked in (waiter, *task.victims):
                    tracked.moving = False
                self._reserved.difference_update(task.keys)
                self._changed = True
                self._cond.notify_all()

    def _idle_suspend(self, tracked: Tracked) -> None:
        try:
            self._suspend(tracked, "idle")
        except Exception:
            log.exception("on-demand idle suspend of %s/%s failed", *tracked.key)
        finally:
            with self._cond:
                tracked.moving, self._changed = False, True
                self._cond.notify_all()

    def _fail(self, tracked: Tracked, ticket: int, exc: ApiError | HotmountError) -> None:
        """A waiter's GPU refused (its quota full): it leaves the queue and its next ask
        is told why, as a quota refusal (nvcli's exit 7) where the quota said no."""
        refusal = self._refusal(exc, "while waiting for a GPU: ")
        with self._cond:
            self.queue.leave(ticket)
            tracked.ticket, tracked.failure = None, refusal

    def _refusal(
        self, exc: ApiError | HotmountError, context: str = ""
    ) -> ApiError | HotmountError:
        """The refusal the caller gets, counted: a pin the namespace's quota refused is a
        quota refusal (nvcli's exit 7, a clear line in the notebook)."""
        if isinstance(exc, PinRefused) and isinstance(exc.__cause__, QuotaExceeded):
            exc = QuotaExceeded(f"{context}{exc.message}")
        self.metrics.refused.labels(getattr(exc, "reason", type(exc).__name__)).inc()
        return exc

    def _drop_abandoned(self, now: float) -> None:
        """Waiters that stopped asking leave the queue; pods whose container is gone (and
        that stopped asking) are forgotten."""
        with self._cond:
            for key, tracked in list(self._pods.items()):
                if now - tracked.last_asked <= LEASE or tracked.moving:
                    continue
                if tracked.ticket is not None:
                    self.queue.leave(tracked.ticket)
                    tracked.ticket, tracked.asked_at, tracked.busy = None, None, False
                    tracked.leaves += 1
                    self.metrics.refused.labels("Abandoned").inc()
                elif self.engine.mounts.record(tracked.container_id) is None:
                    del self._pods[key]

    def _due(self, now: float) -> list[Tracked]:
        """Attached pods idle past their time, marked `moving` for the suspend."""
        with self._cond:
            due = [
                t for t in self._pods.values()
                if t.attached_at is not None and not t.busy and not t.moving
                and t.idle_since is not None and now - t.idle_since >= self._idle_of(t)
                and t.refused_until <= now
            ]  # fmt: skip
            for tracked in due:
                tracked.moving = True
            return due

    def _count(self, now: float) -> None:
        """GPU-seconds attached, against those the pods would hold with dedicated GPUs."""
        with self._cond:
            since, self._counted_at = self._counted_at, now
            if since is None:
                return
            span = now - since
            for tracked in self._pods.values():
                self.metrics.dedicated_seconds.inc(span * tracked.wants.count)
                if tracked.attached_at is not None:
                    self.metrics.gpu_seconds.inc(span * tracked.wants.count)
