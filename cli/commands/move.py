"""`nvcli move`: a GPU from one pod to another."""

from __future__ import annotations

from typing import Annotated

import typer

from cli.options import Common
from cli.output import Waiting
from cli.reach import check_modes, make_client, namespace_of
from cli.wiring import (
    Force,
    emit,
    local_engine,
    with_common,
)


@with_common
def move(
    opts: Common,
    gpu: Annotated[
        str, typer.Option("--gpu", metavar="DEVICE", help="the device: index, UUID or CDI name")
    ],
    from_: Annotated[
        str,
        typer.Option(
            "--from", metavar="POD", help="the pod that has it (container ID with --local)"
        ),
    ],
    to: Annotated[
        str,
        typer.Option(
            "--to", metavar="POD", help="the pod that gets it (container ID with --local)"
        ),
    ],
    from_namespace: Annotated[
        str | None,
        typer.Option("--from-namespace", metavar="NS", help="default: -n, then the context's"),
    ] = None,
    to_namespace: Annotated[
        str | None,
        typer.Option("--to-namespace", metavar="NS", help="default: -n, then the context's"),
    ] = None,
    from_container: Annotated[str | None, typer.Option("--from-container", metavar="NAME")] = None,
    to_container: Annotated[str | None, typer.Option("--to-container", metavar="NAME")] = None,
    force: Force = False,
) -> None:
    """Move a GPU from one pod to another (unmount there, mount here).

    \b
    Example:
      nvcli move --gpu 0 --from notebook-0 --to notebook-1
      nvcli move --gpu 0 --from a --from-namespace team-a --to b --to-namespace team-b --force
    """
    check_modes(opts)
    if opts.local:
        emit(local_engine(opts).move(gpu, from_, to, force), opts)
        return
    default_ns = None if (from_namespace and to_namespace) else namespace_of(opts)
    src = (from_namespace or default_ns or "", from_, from_container)
    dst = (to_namespace or default_ns or "", to, to_container)
    with make_client(opts) as client, Waiting("moving..."):
        result = client.move(gpu, src, dst, force=force)
    emit(result, opts)
