"""Idle reclaim's pure logic: durations, policies, the idle clock, the warning and the
decision to reclaim.

A hot-mounted GPU is idle, under the mount's policy, while
- `unheld` (the default): no process in its container holds its device node open (nor
  shows in NVML's process list);
- `unused`: NVML shows neither SM nor memory-copy activity, even while processes hold
  it (a notebook kernel that ran one CUDA cell holds /dev/nvidia0 until it exits).
  A GPU NVML cannot sample (a MIG instance on most drivers) falls back to `unheld`;
- `suspend`: idle as under `unused`, but the reclaim suspends the container's GPUs
  (hotmount/suspend/: its processes kept alive, their GPU memory in host memory)
  instead of stopping their holders; a refused suspension stops nothing.

Durations (`30m`, `1h30m`) are parsed and printed by hotmount/wire/durations.py, which
the CLI shares. The reconciler looks every pass; this module decides, with no I/O, so the rules are
tested exactly:

- the clock is conservative: a mount's idle time starts at the first look that found
  it idle (the look's time taken *after* the scan), never earlier, and any use resets
  it. It is kept beside the ledger (agent/idle/clocks.py), so an agent restart
  never shortens it;
- a warning comes first: `warn_lead(timeout)` before the reclaim (a tenth of the
  timeout, at least a minute, at most the timeout), and the reclaim never comes sooner
  than that lead after the warning, even when a restart found the clock already due;
- a GPU is reclaimed only when it has a timeout, is idle now, has been idle that long,
  and was warned long enough before.
"""

from __future__ import annotations

import threading
from collections.abc import Hashable, Iterable

from hotmount.wire.durations import format_duration, parse_duration

TIMEOUT_KEY = "idleTimeout"  # ledger metadata: the mount's idle timeout, in seconds
MOUNT_ID_KEY = "mountId"  # ledger metadata: one mount, the key of its idle clock
ANNOTATION = "hotmount.io/idle-timeout"
POLICY_KEY = "idlePolicy"  # ledger metadata: `unheld`, `unused` or `suspend`
POLICY_ANNOTATION = "hotmount.io/idle-policy"
WARN_KEY = "warnBefore"  # ledger metadata: how long before the reclaim to warn, in seconds
WARN_ANNOTATION = "hotmount.io/idle-warn-before"
UNHELD, UNUSED, SUSPEND = "unheld", "unused", "suspend"
POLICIES = (UNHELD, UNUSED, SUSPEND)
MIN_WARN_LEAD = 60.0  # seconds: the shortest warning before a reclaim (unless the timeout is)


def timeout_of(metadata: dict[str, str]) -> float | None:
    """A mount's idle timeout from its ledger metadata; None (never reclaimed) if absent
    or unreadable: a record the agent cannot read is left alone, not reclaimed."""
    raw = metadata.get(TIMEOUT_KEY)
    if not raw:
        return None
    try:
        value = float(raw)
    except ValueError:
        return None
    return value if value > 0 else None


def choose_timeout(
    requested: str | None, annotations: dict[str, str], default: str | None
) -> float | None:
    """The request's `idleTimeout`, else the pod's annotation, else the node's default.

    A bad annotation raises ValueError naming it (the request was validated already)."""
    if requested:
        return parse_duration(requested)
    annotated = annotations.get(ANNOTATION)
    if annotated is not None:
        try:
            return parse_duration(annotated)
        except ValueError as exc:
            raise ValueError(f"pod annotation {ANNOTATION}: {exc}") from exc
    return parse_duration(default) if default else None


def choose_policy(requested: str | None, annotations: dict[str, str], default: str) -> str:
    """The request's `idlePolicy`, else the pod's annotation, else the node's default.

    A bad annotation raises ValueError naming it (the request was validated already)."""
    if requested:
        return requested
    annotated = annotations.get(POLICY_ANNOTATION)
    if annotated is not None:
        value = annotated.strip()
        if value not in POLICIES:
            raise ValueError(
                f"pod annotation {POLICY_ANNOTATION}: {annotated!r} is not an idle policy: "
                f"write {', '.join(POLICIES)}"
            )
        return value
    return default


def policy_of(metadata: dict[str, str]) -> str:
    """A mount's policy from its ledger metadata; mounts from before policies (or with
    a value this agent does not know) are `unheld`, the one that never stops a holder."""
    value = metadata.get(POLICY_KEY)
    return value if value in POLICIES else UNHELD


def judged_by_use(policy: str) -> bool:
    """`unused` and `suspend` look at NVML's utilization, not at who holds the GPU."""
    return policy in (UNUSED, SUSPEND)


def warn_lead(timeout: float, before: float | None = None) -> float:
    """How long before the reclaim the warning comes: the mount's `warnBefore` if it has
    one, else a tenth of the timeout, at least a minute; never more than the timeout
    itself (a 30s timeout warns at its start)."""
    if before is not None:
        return min(timeout, before)
    return min(timeout, max(MIN_WARN_LEAD, timeout / 10))


def reclaim_at(
    timeout: float, since: float, warned_at: float | None, before: float | None = None
) -> float:
    """When a mount idle since `since` is due: at the timeout, but never sooner than the
    lead after its warning (a warning given late, after a restart, still gives it)."""
    due = since + timeout
    return due if warned_at is None else max(due, warned_at + warn_lead(timeout, before))


def should_reclaim(
    timeout: float | None,
    since: float | None,
    warned_at: float | None,
    now: float,
    before: float | None = None,
) -> bool:
    """Reclaim only a GPU with a timeout, idle now (`since` set), warned, and due
    (`reclaim_at`): never one in use, never one not warned first."""
    if timeout is None or since is None or warned_at is None:
        return False
    return now >= reclaim_at(timeout, since, warned_at, before)


def should_warn(
    timeout: float | None,
    since: float | None,
    warned_at: float | None,
    now: float,
    before: float | None = None,
) -> bool:
    """Warn once, `warn_lead` before the timeout, while idle."""
    if timeout is None or since is None or warned_at is not None:
        return False
    return now >= since + timeout - warn_lead(timeout, before)


def choose_warn_before(
    requested: str | None, annotations: dict[str, str], timeout: float | None
) -> float | None:
    """The request's `warnBefore`, else the pod's annotation; None: the default lead.

    Only with an idle timeout, and shorter than it: a warning as long as the timeout
    would come before the GPU was ever idle. Raises ValueError saying which is wrong."""
    annotated = annotations.get(WARN_ANNOTATION)
    source = "warnBefore" if requested else f"pod annotation {WARN_ANNOTATION}"
    raw = requested or annotated
    if raw is None:
        return None
    try:
        before = parse_duration(raw)
    except ValueError as exc:
        raise ValueError(f"{source}: {exc}") from exc
    if timeout is None:
        raise ValueError(f"{source} {raw!r} needs an idle timeout (idleTimeout)")
    if before >= timeout:
        raise ValueError(
            f"{source} {raw!r} must be shorter than the idle timeout {format_duration(timeout)}"
        )
    return before


def warn_before_of(metadata: dict[str, str]) -> float | None:
    """A mount's `warnBefore` from its ledger metadata; None (the default lead) if absent
    or unreadable."""
    try:
        value = float(metadata.get(WARN_KEY) or 0)
    except ValueError:
        return None
    return value if value > 0 else None


class IdleClock:
    """When each mount was first seen idle, and when it was warned (wall-clock seconds:
    they are kept across agent restarts by agent/idle/clocks.py).

    Keys name one mount (container, device, mount ID): a GPU unmounted and mounted
    again starts a new clock. Thread-safe: the reconcile pass looks, routes read, and an
    idle suspension running beside the pass (agent/common/background.py) restarts or
    forgets its clocks.
    """

    def __init__(self) -> None:
        self._since: dict[Hashable, float | None] = {}  # None: used at the last look
        self._warned: dict[Hashable, float] = {}
        self._guard = threading.Lock()

    def observe(self, key: Hashable, holders: int, now: float) -> float | None:
        """Record one look; returns since when the mount has been idle (None: held).

        `now` must be taken after the scan that counted `holders`: a process that let
        go during the scan then counts as idle from the end of it, not before."""
        with self._guard:
            if holders > 0:
                self._since[key] = None
                self._warned.pop(key, None)  # any use resets the clock and its warning
                return None
            since = self._since.get(key)
            if since is None:
                since = self._since[key] = now
            return since

    def idle_for(self, key: Hashable, now: float) -> float | None:
        """Seconds idle so far: 0 when held at the last look, None when not looked at yet."""
        with self._guard:
            if key not in self._since:
                return None
            since = self._since[key]
        return 0.0 if since is None else max(0.0, now - since)

    def since(self, key: Hashable) -> float | None:
        with self._guard:
            return self._since.get(key)

    def warned_at(self, key: Hashable) -> float | None:
        with self._guard:
            return self._warned.get(key)

    def warn(self, key: Hashable, now: float) -> None:
        with self._guard:
            self._warned[key] = now

    def forget(self, key: Hashable) -> None:
        with self._guard:
            self._since.pop(key, None)
            self._warned.pop(key, None)

    def retain(self, keys: Iterable[Hashable]) -> None:
        """Drop the clocks of mounts that are gone."""
        keep = set(keys)
        with self._guard:
            self._since = {k: v for k, v in self._since.items() if k in keep}
            self._warned = {k: v for k, v in self._warned.items() if k in keep}

    def restore(
        self, key: Hashable, since: float | None, warned_at: float | None, now: float
    ) -> None:
        """A clock kept from before a restart. A time in the future (the wall clock went
        back) is taken as now: idle for less, never for more."""
        with self._guard:
            self._since[key] = None if since is None else min(since, now)
            if since is not None and warned_at is not None:
                self._warned[key] = min(warned_at, now)

    def items(self) -> list[tuple[Hashable, float | None, float | None]]:
        """(key, since, warned_at) for every clock, for keeping beside the ledger."""
        with self._guard:
            return [(k, v, self._warned.get(k)) for k, v in self._since.items()]
