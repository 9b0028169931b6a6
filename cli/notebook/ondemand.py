"""On-demand GPUs in a notebook (issue 42, docs/notebooks.md): the pod holds a GPU only
while its cells run.

With `GPU_HOTMOUNT_ON_DEMAND=1` in the kernel's environment (the platform sets it with
the pod's `hotmount.io/gpu-on-demand` annotation), `OnDemandCells.before`, IPython's
`pre_run_cell` hook, asks the agent for the pod's GPU before each cell: attached at once
when the pod holds it, resumed onto any free GPU of its model when it was suspended, or
the pod's place in the node's queue, shown as it changes (`%gpu: waiting for a GPU: 2nd
in line, about 40s`) while the call is repeated. Ctrl-C (the notebook's interrupt) gives
the place up (IPython runs a cell whatever its hook raises: the cell then runs without a
GPU, and says so). `after`, on `post_run_cell`, says the cell ended: the
agent suspends the GPU after the pod's idle time, the kernel and its GPU memory kept.

A refusal is one line and the cell runs without a GPU (a quota with no room says so);
an unreachable agent is quiet for a minute, as the other hooks are. `%gpu` cells are
left alone.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cli.notebook.config import Config

POLL = 20.0  # the agent's longest wait per call (hotmount/wire/ondemand.py)
FIRST_LOOK = 1.0  # the first call's wait: a GPU freeing now is taken, a queue shown soon
ENABLE = "GPU_HOTMOUNT_ON_DEMAND"


def enabled(env: dict[str, str] | None = None) -> bool:
    import os

    value = (os.environ if env is None else env).get(ENABLE, "")
    return value.strip().lower() not in ("", "0", "false", "no")


@dataclass
class OnDemandCells:
    config_of: Callable[[], Config]
    explain: Callable[[BaseException, Config], str]  # an error in one line
    stream: Any = None
    backoff: float = 60.0
    release_timeout: float = 2.0
    _quiet_until: float = 0.0
    _asked: bool = False  # this cell asked (so its end is told)

    def before(self, info: Any = None) -> None:
        """Before a cell: the pod's GPU, waiting in line as long as it takes (Ctrl-C
        gives the place up). Never raises."""
        cell = (getattr(info, "raw_cell", None) or "").lstrip()
        self._asked = False
        if cell.startswith(("%gpu", "%%gpu")) or time.monotonic() < self._quiet_until:
            return
        try:
            config = self.config_of()
            client = config.client(POLL + 30)
        except Exception:
            self._quiet_until = time.monotonic() + self.backoff
            return
        with client:
            self._asked = True
            try:
                self._say(self._wait(client, config))
            except KeyboardInterrupt:  # IPython would run the cell anyway: say so
                self._leave(config)
                self._say(
                    "%gpu: stopped waiting for a GPU; the place in line is given up and this "
                    "cell runs without one (interrupt it again to stop it)"
                )
            except Exception as exc:
                self._say(self._refused(exc, config))

    def after(self, result: Any = None) -> None:
        """After a cell that asked: the agent may suspend the GPU after the idle time."""
        if not self._asked:
            return
        self._asked = False
        try:
            config = self.config_of()
            with config.client(self.release_timeout) as client:
                client.release(config.namespace, config.pod, config.container)
        except Exception:  # its GPU stays attached until the next cell: nothing lost
            self._quiet_until = time.monotonic() + self.backoff

    def _wait(self, client: Any, config: Config) -> str | None:
        """The first call answers within FIRST_LOOK, so a place in line shows at once;
        the next ones wait as long as the agent lets them."""
        shown, wait = "", FIRST_LOOK
        while True:
            got = client.acquire(config.namespace, config.pod, config.container, wait=wait)
            wait = POLL
            if got.state == "attached":
                return _attached_line(got)
            if got.message != shown:
                self._say(f"%gpu: {got.message}")
                shown = got.message
            if got.retry_after_seconds:  # many cells wait on the agent: ask a bit later
                time.sleep(got.retry_after_seconds)

    def _leave(self, config: Config) -> None:
        """On a client of its own: the interrupted call's connection is mid-answer."""
        import contextlib

        # Failing, the agent drops a place no one asks for within its lease.
        with contextlib.suppress(Exception), config.client(self.release_timeout) as client:
            client.release(config.namespace, config.pod, config.container, leave=True)

    def _refused(self, exc: BaseException, config: Config) -> str:
        if getattr(exc, "reason", None) == "QuotaExceeded":
            why = getattr(exc, "message", str(exc))
            return f"%gpu: no GPU for this cell: the namespace's GPU quota is full ({why})"
        try:
            text = self.explain(exc, config)
        except Exception:
            text = str(exc)
        return f"%gpu: no GPU for this cell: {text}; it runs without one"

    def _say(self, line: str | None) -> None:
        if line:
            print(line, file=self.stream or sys.stderr, flush=True)


def _attached_line(got: Any) -> str | None:
    """One line when something happened (a resume, a wait); none for a GPU still held."""
    if got.resumed:
        onto = ", ".join(old if old == new else f"{old} onto {new}"
                         for old, new in got.resumed.items())  # fmt: skip
        waited = f" after {got.waited_seconds:.1f}s" if got.waited_seconds >= 0.5 else ""
        return f"%gpu: resumed {onto}{waited}"
    if got.waited_seconds >= 1:
        return f"%gpu: GPU {', '.join(got.devices)} attached after {got.waited_seconds:.1f}s"
    return None
