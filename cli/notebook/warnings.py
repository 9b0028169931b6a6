"""The reclaim warning after a cell (issue 20): `%gpu: GPU 0 will be reclaimed in 4m
unless used` (or `suspended`, under the idle policy `suspend`), once per warning."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any

from cli.notebook.config import Config

# -- the reclaim warning after a cell ---------------------------------------------------------


@dataclass
class ReclaimWarnings:
    """Says once per warning, after the next cell, that a GPU of this pod will be reclaimed.

    The agent warns (`GPUIdleSoon`) before an idle GPU is reclaimed; a notebook user
    reads neither Events nor `nvcli status`. IPython's `post_run_cell` calls this after
    every cell, in the kernel's own thread (no background thread): it asks the agent for
    this pod's status with a short timeout and prints nothing on any error. After an
    error it stays quiet for `backoff` seconds, so a kernel whose agent is unreachable
    (or that is not in a pod) pays no more than one short call a minute.

    One warning is one mount (container, GPU, mountedAt) until the reclaim it announces
    moves later (the GPU was used, the clock reset, and it was warned again) or the
    warning goes away.
    """

    config: Config | None = None
    timeout: float = 2.0
    backoff: float = 60.0
    stream: Any = None
    _shown: dict[tuple[str, str, str], float] = field(default_factory=dict)
    _quiet_until: float = 0.0
    # The last look saw a GPU under the idle policy `suspend`, or a suspended one: the
    # next cell asks first whether to resume (cli/notebook/suspend.py).
    suspendable: bool = False

    SLACK = 5.0  # seconds: the same warning's deadline, seen twice, moves by less

    def __call__(self, *_: Any) -> None:
        import time

        now = time.monotonic()
        if now < self._quiet_until:
            return
        try:
            devices = self._warned(now)
        except Exception:  # never a traceback under the user's cell
            self._quiet_until = time.monotonic() + self.backoff
            return
        lines = []
        for key, gpu, seconds, deadline, policy in devices:
            shown = self._shown.get(key)
            if shown is None or deadline > shown + self.SLACK:
                lines.append(f"%gpu: {gpu} will be {_reclaim_text(seconds, policy)}")
            self._shown[key] = deadline if shown is None else max(shown, deadline)
        for key in set(self._shown) - {d[0] for d in devices}:
            del self._shown[key]  # no longer warned: a new warning is said again
        if lines:
            print("\n".join(lines), file=self.stream or sys.stderr)

    def _warned(self, now: float) -> list[tuple[tuple[str, str, str], str, int, float, str | None]]:
        """(identity, `GPU 0`, seconds left, monotonic deadline, idle policy) per warned
        mount."""
        from cli.client import HotmountClient

        config = self.config or Config.from_env()
        verify: str | bool = str(config.ca_file) if config.ca_file else True
        with HotmountClient.for_agent(
            config.agent, config.token(), verify=verify, timeout=self.timeout
        ) as client:
            result = client.status(config.namespace, config.pod)
        self.suspendable = any(
            d.state == "suspended" or d.idle_policy == "suspend"
            for c in result.containers
            for d in c.devices
        )
        return [
            (
                (c.container_id, d.key, d.mounted_at or ""),
                f"GPU {d.index}" if d.index is not None else d.key,
                d.reclaim_in_seconds,
                now + d.reclaim_in_seconds,
                d.idle_policy,
            )
            for c in result.containers
            for d in c.devices
            if d.reclaim_in_seconds is not None
        ]


def _reclaim_text(seconds: int, policy: str | None) -> str:
    """`reclaimed in 4m unless used`, or under the policy `suspend` `suspended in ...`."""
    from cli.output import reclaim_text

    return reclaim_text(seconds, policy)
