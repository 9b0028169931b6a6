"""`%gpu suspend`, `%gpu resume`, and the resume before the next cell (issue 33).

A suspended pod's CUDA processes are alive, their GPU memory in host memory
(docs/api.md, "Suspend and resume"); the idle policy `suspend` does that on its own.
`AutoResume`, IPython's `pre_run_cell` hook, gives the pod a GPU back before the user's
next cell runs, so that cell finds its tensors: one status call (2s at most, quiet on
error, then quiet for a minute), and only while a GPU of this pod is suspended, one
resume call (bounded). When no GPU of the model is free it prints one line and lets
the cell run without a GPU; the next cell tries again.

While a suspend or resume runs, its progress is polled (cli/progress.py: GET on the same
path) and each new line goes to `say`: `%gpu suspend|resume` print them above their
result, the resume before a cell above its one line.

Imports stay lazy: the client and the agent's models load on the first call.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from contextlib import AbstractContextManager, ExitStack, nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cli.notebook.config import Config
    from cli.transport.transports import Op
    from hotmount.wire.schemas import ResumeResult, SuspendResult

RESUME_TIMEOUT = 300.0  # seconds: a restore moves GPU memory back, seconds per GiB


Say = Callable[[str], None]  # where the progress lines go


def _progress(config: Config, op: Op, say: Say | None) -> AbstractContextManager[object]:
    """The progress lines to `say` while the POST runs, polled on a client of its own."""
    if say is None:
        return nullcontext()
    from cli.output import to_data
    from cli.progress import Polling

    stack = ExitStack()
    client = stack.enter_context(config.client(2.0))

    def look() -> Any:
        return to_data(client.progress(config.namespace, config.pod, op, config.container))

    stack.enter_context(Polling(look, say))
    return stack


def suspend(config: Config, say: Say | None = None) -> SuspendResult:
    """Take this pod's hot-mounted GPUs away, its CUDA processes and their memory kept;
    `say`: where each progress line goes while it runs (none: not polled)."""
    with config.client(RESUME_TIMEOUT) as client, _progress(config, "suspend", say):
        return client.suspend(config.namespace, config.pod, config.container)


def resume(config: Config, timeout: float | None = None, say: Say | None = None) -> ResumeResult:
    """Give this pod a GPU of the same model back, its processes restored onto it."""
    with config.client(timeout or RESUME_TIMEOUT) as client, _progress(config, "resume", say):
        return client.resume(config.namespace, config.pod, config.container)


def suspended_message(result: SuspendResult) -> str:
    return (
        f"suspended {', '.join(result.suspended)}: {len(result.processes)} processes kept, "
        f"{result.host_bytes >> 20} MiB of GPU memory in host memory; "
        "the next cell (or %gpu resume) gives a GPU back"
    )


def resumed_message(result: ResumeResult) -> str:
    onto = ", ".join(
        old if old == new else f"{old} onto {new}" for old, new in result.resumed.items()
    )
    return f"resumed {onto}: {len(result.processes)} processes restored with their GPU memory"


@dataclass
class AutoResume:
    """Before each cell, resume this pod's suspended GPUs (IPython's `pre_run_cell`).

    A `%gpu` cell is left alone (`%gpu status` shows the suspension; `%gpu resume`
    does it itself). It asks only while `watching()` (the last look after a cell saw a
    GPU under the idle policy `suspend`, or a suspended one): a pod that never suspends
    pays no call. Never raises under the user's cell: every failure is one line."""

    config_of: Callable[[], Config]  # this pod's Config (from the environment)
    explain: Callable[[BaseException, Config], str]  # an error in one line
    watching: Callable[[], bool] = lambda: True
    timeout: float = 2.0  # the status call
    resume_timeout: float = RESUME_TIMEOUT
    backoff: float = 60.0
    stream: Any = None
    _quiet_until: float = 0.0

    def __call__(self, info: Any = None) -> None:
        import time

        cell = (getattr(info, "raw_cell", None) or "").lstrip()
        if cell.startswith(("%gpu", "%%gpu")) or time.monotonic() < self._quiet_until:
            return
        if not self.watching():
            return
        try:
            config = self.config_of()
            if not self._suspended(config):
                return
        except Exception:  # not in a pod, no agent: quiet, and not asked again for a while
            self._quiet_until = time.monotonic() + self.backoff
            return
        print(self._resume(config), file=self.stream or sys.stderr)

    def _suspended(self, config: Config) -> bool:
        from cli.client import HotmountClient

        verify: str | bool = str(config.ca_file) if config.ca_file else True
        with HotmountClient.for_agent(
            config.agent, config.token(), verify=verify, timeout=self.timeout
        ) as client:
            result = client.status(config.namespace, config.pod)
        return any(d.state == "suspended" for c in result.containers for d in c.devices)

    def _resume(self, config: Config) -> str:
        """One resume call; its one-line outcome."""
        stream = self.stream or sys.stderr

        def say(line: str) -> None:
            print(f"%gpu: {line}", file=stream, flush=True)

        try:
            return "%gpu: " + resumed_message(resume(config, self.resume_timeout, say))
        except Exception as exc:
            reason = getattr(exc, "reason", None)
            if reason == "NoGpuFree":
                why = getattr(exc, "message", str(exc))
                return (
                    f"%gpu: this pod's GPU is suspended and {why}: this cell runs without a "
                    "GPU (a CUDA call waits until one is back); the next cell tries again"
                )
            try:
                text = self.explain(exc, config)
            except Exception:
                text = str(exc)
            return f"%gpu: could not resume this pod's GPU: {text}; this cell runs without it"
