"""`nvcli status`: what is hot-mounted in a pod. A plain status line is answered by
cli/statusline.py without typer; this command runs the same `show` for every other."""

from __future__ import annotations

from typing import Annotated

import typer

from cli.options import Common
from cli.reach import check_modes, pick_target
from cli.statusline import show
from cli.wiring import (
    Name,
    emit,
    local_engine,
    with_common,
)


@with_common
def status(
    opts: Common,
    name: Name = None,
    container: Annotated[
        str | None,
        typer.Option("--container", metavar="NAME", help="only this container; ID with --local"),
    ] = None,
) -> None:
    """Show what is hot-mounted in a pod.

    \b
    Example:
      nvcli status --name notebook-0 -n ml
      nvcli status --name notebook-0 -o yaml
    """
    check_modes(opts)
    kind, target = pick_target(opts, name, container)
    if opts.local:
        emit(local_engine(opts).status(target or ""), opts)
        return
    show(opts, kind, target or "", container, typer.echo)
