"""`nvcli acquire` and `nvcli release`: an on-demand pod's GPU (docs/notebooks.md), as a
notebook's cell asks for it, from a shell or a script.

`acquire` waits until the pod holds its GPU: each answer of `waiting` prints the pod's
place once it changes (`waiting for a GPU: 2nd in line, about 40s`), and the call is
made again with the agent's longest poll. Ctrl-C gives the place up (a release with
`leave`) before it exits, so nothing stays queued. A quota that has no room for the GPU
is exit 7, as for a mount.
"""

from __future__ import annotations

import sys
import time
from typing import Annotated

import typer

from cli.commands.suspend import Container, Name, pod_through_agent
from cli.options import Common
from cli.output import render
from cli.reach import make_client, namespace_of
from cli.wiring import with_common
from hotmount.wire.errors import EXIT_TIMEOUT

# As the notebook's cells ask (cli/notebook/ondemand.py; not imported: it loads the
# notebook extension): the first call answers within a second, so a place in line shows at
# once; the next ones wait as long as the agent lets them (hotmount/wire/ondemand.py).
FIRST_LOOK, POLL = 1.0, 20.0


@with_common
def acquire(
    opts: Common,
    name: Name = None,
    container: Container = None,
    max_wait: Annotated[
        float | None,
        typer.Option(
            "--max-wait", metavar="SECONDS", min=0, help="give up after this long (default: wait)"
        ),
    ] = None,
) -> None:
    """Give an on-demand pod its GPU: resumed onto any free GPU of its model, or its
    place in the node's queue until one frees. Ctrl-C stops waiting.

    \b
    Example:
      nvcli acquire --name notebook-0
    """
    pod = pod_through_agent(opts, name, "acquire and release")
    namespace = namespace_of(opts)
    deadline = None if max_wait is None else time.monotonic() + max_wait
    shown, poll = "", FIRST_LOOK  # the place in line shown within a second
    with make_client(opts) as client:
        try:
            while True:
                left = POLL if deadline is None else max(0.0, deadline - time.monotonic())
                result = client.acquire(namespace, pod, container, wait=min(poll, left))
                poll = POLL
                if result.state == "attached":
                    break
                if result.message != shown and opts.fmt == "table":
                    print(result.message, file=sys.stderr, flush=True)
                    shown = result.message
                if result.retry_after_seconds:  # many wait on the agent: ask a bit later
                    time.sleep(result.retry_after_seconds)
                if deadline is not None and time.monotonic() >= deadline:
                    client.release(namespace, pod, container, leave=True)
                    print(f"error: no GPU within {max_wait:g}s; the place is given up",
                          file=sys.stderr)  # fmt: skip
                    raise typer.Exit(EXIT_TIMEOUT)
        except KeyboardInterrupt:  # a client of its own: the interrupted one is mid-answer
            with make_client(opts) as fresh:
                fresh.release(namespace, pod, container, leave=True)
            print("stopped waiting for a GPU; the place is given up", file=sys.stderr)
            raise typer.Exit(130) from None
    if opts.fmt != "table":
        typer.echo(render(result, opts.fmt))
        return
    onto = ", ".join(old if old == new else f"{old} onto {new}"
                     for old, new in result.resumed.items())  # fmt: skip
    how = f" (resumed {onto})" if onto else ""
    waited = f" after {result.waited_seconds:.1f}s" if result.waited_seconds >= 1 else ""
    typer.echo(f"{result.pod}/{result.container} holds {', '.join(result.devices)}{how}{waited}")


@with_common
def release(
    opts: Common,
    name: Name = None,
    container: Container = None,
    leave: Annotated[
        bool, typer.Option("--leave", help="stop waiting for a GPU (give the place up)")
    ] = False,
) -> None:
    """Say an on-demand pod's work ended: its GPU is suspended after the pod's idle time
    (its processes and GPU memory kept), unless it asks again.

    \b
    Example:
      nvcli release --name notebook-0
    """
    pod = pod_through_agent(opts, name, "acquire and release")
    with make_client(opts) as client:
        result = client.release(namespace_of(opts), pod, container, leave=leave)
    typer.echo(render(result, opts.fmt) if opts.fmt != "table" else result.message)
