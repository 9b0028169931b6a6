"""`nvcli list`: the devices of a node, or of every node, and who holds each."""

from __future__ import annotations

from typing import Annotated

import typer

from cli.options import Common
from cli.reach import check_modes, make_client
from cli.wiring import (
    emit,
    local_engine,
    with_common,
)


@with_common
def list_(
    opts: Common,
    node: Annotated[
        str | None, typer.Option("--node", metavar="NODE", help="only this node")
    ] = None,
) -> None:
    """List the devices on a node and who holds each.

    \b
    Example:
      nvcli list --node gpu-node-1
      nvcli list -o json
    """
    check_modes(opts)
    if opts.local:
        emit(local_engine(opts).list_devices(), opts)
        return
    with make_client(opts) as client:
        result = client.list_devices(node)
    from cli.partial import warning_lines

    for line in warning_lines(result):
        typer.echo(line, err=True)
    emit(result, opts)
