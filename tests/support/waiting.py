"""Bounded waits for what the kernel (or an agent's loop) does after it was told to.

Much of what a test observes happens asynchronously: a network namespace is torn down by
a kernel workqueue (`cleanup_net`) after its last reference goes, so its veth pairs and
returned NICs show up a moment later; a cgroup is removable only once its last task is
reaped; a BPF program is detached when its last fd closes; a zombie holds a device until
its parent reaps it. One look right after the cause is a race. These helpers poll until
the condition holds or a deadline passes, then fail naming what they waited for, so the
assertion stays and only its timing becomes honest. The deadline bounds a hung kernel or
agent; it is not a timing assertion.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

DEFAULT_PATIENCE = 10.0


def wait_for(
    condition: Callable[[], T],
    what: str,
    timeout: float = DEFAULT_PATIENCE,
    interval: float = 0.05,
    show: Callable[[], object] | None = None,
) -> T:
    """The first truthy value of `condition()`, polled until `timeout` seconds pass.

    Fails with `what` (what should have happened) and what was seen last: `show()` where
    given (the state the condition reads), else the condition's last value. An exception
    from `condition()` is not retried: it propagates (an assertion made while waiting).
    """
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            seen = _shown(show) if show is not None else value
            raise AssertionError(f"waited {timeout:g} s for {what}; last seen: {seen!r}")
        time.sleep(interval)


def _shown(show: Callable[[], object]) -> object:
    """`show()`, or why it failed: the state may be gone by now (a process, a cgroup), and
    the failure to report is the wait's, not that."""
    try:
        return show()
    except Exception as exc:  # any failure of a diagnostic is only reported
        return f"<show() failed: {exc!r}>"
