"""`nvcli suspend` and `nvcli resume`: take a pod's hot-mounted GPUs away with its CUDA
processes kept (their GPU memory moved into host memory), and give a GPU back
(docs/api.md, "Suspend and resume").

On a terminal a spinner runs while the agent works, and above it a line each time the
progress changes (cli/progress.py: GET on the same path, polled while the POST runs):
the processes locked and checkpointed (or restored), and the GPU memory moved. `-o json`
and `-o yaml` print only the result: no spinner, no progress, not even on a terminal.
Imports stay lazy: the client and the agent's models load when a command runs
(tests/cli/test_imports.py).
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING, Annotated, Any

import typer

from cli.options import Common
from cli.output import Waiting, render, to_data
from cli.reach import UsageError, make_client, namespace_of
from cli.wiring import with_common

if TYPE_CHECKING:
    from cli.transport.transports import Op

Name = Annotated[str | None, typer.Option("--name", metavar="POD", help="the pod")]
Container = Annotated[
    str | None, typer.Option("--container", metavar="NAME", help="container name")
]


@with_common
def suspend(
    opts: Common,
    name: Name = None,
    container: Container = None,
    lock_timeout: Annotated[
        float,
        typer.Option(
            "--lock-timeout",
            metavar="SECONDS",
            min=0.1,
            max=30,  # the agent's cap (hotmount/wire/schemas.py MAX_LOCK_TIMEOUT)
            help="how long each CUDA process may take to lock (at most 30)",
        ),
    ] = 10.0,
) -> None:
    """Take a pod's hot-mounted GPUs away, keeping its processes and their GPU memory.

    Each CUDA process is checkpointed: its GPU memory moves into its host memory (the
    container's memory limit must have room) and the GPU goes back to the node. Taking
    a GPU from processes that hold it needs the verb force on gpumounts
    (hotmount-admin), as a forced unmount does.

    \b
    Example:
      nvcli suspend --name notebook-0
    """
    pod = pod_through_agent(opts, name)
    namespace = namespace_of(opts)
    with (
        make_client(opts) as client,
        Waiting("suspending (checkpointing GPU memory)...", enabled=opts.fmt == "table") as waiting,
        _progress(opts, waiting, namespace, pod, "suspend", container),
    ):
        result = client.suspend(namespace, pod, container, lock_timeout=lock_timeout)
    if opts.fmt != "table":
        typer.echo(render(result, opts.fmt))
        return
    moved = result.host_bytes >> 20
    typer.echo(
        f"suspended {', '.join(result.suspended)} of {result.pod}/{result.container}: "
        f"{len(result.processes)} processes kept, {moved} MiB of GPU memory in host memory"
    )


@with_common
def resume(
    opts: Common,
    name: Name = None,
    container: Container = None,
    mount: Annotated[
        list[str] | None,
        typer.Option(
            "--mount",
            metavar="INDEX|UUID",
            help="the GPU to resume onto (default: the same if free, else one of its model)",
        ),
    ] = None,
) -> None:
    """Give a suspended pod a GPU of the same model and restore its processes onto it.

    \b
    Example:
      nvcli resume --name notebook-0
      nvcli resume --name notebook-0 --mount 1
    """
    pod = pod_through_agent(opts, name)
    refs = [ref for value in mount for ref in value.split(",") if ref] if mount else None
    namespace = namespace_of(opts)
    with (
        make_client(opts) as client,
        Waiting("resuming (restoring GPU memory)...", enabled=opts.fmt == "table") as waiting,
        _progress(opts, waiting, namespace, pod, "resume", container),
    ):
        result = client.resume(namespace, pod, container, mount=refs)
    if opts.fmt != "table":
        typer.echo(render(result, opts.fmt))
        return
    onto = ", ".join(
        old if old == new else f"{old} onto {new}" for old, new in result.resumed.items()
    )
    typer.echo(
        f"resumed {onto} in {result.pod}/{result.container}: "
        f"{len(result.processes)} processes restored"
    )


def pod_through_agent(opts: Common, name: str | None, verbs: str = "suspend and resume") -> str:
    """The pod `--name` names, for `verbs` that only an agent does (no `--local`)."""
    if opts.local:
        raise UsageError(f"{verbs} go through an agent: --local is not supported")
    if not name:
        raise UsageError("Missing option '--name' (the pod)")
    return name


def _progress(
    opts: Common, waiting: Waiting, namespace: str, pod: str, verb: Op, container: str | None
) -> AbstractContextManager[object]:
    """On a terminal with `-o table`: the progress lines, polled on a client of its own
    (one connection each: the POST's is busy until it is done). Else nothing."""
    if not waiting.active:  # not a terminal, or not -o table
        return nullcontext()
    from contextlib import ExitStack

    from cli.progress import Polling

    stack = ExitStack()
    client = stack.enter_context(make_client(opts))

    def look() -> Any:
        return to_data(client.progress(namespace, pod, verb, container))

    stack.enter_context(Polling(look, waiting.say))
    return stack
