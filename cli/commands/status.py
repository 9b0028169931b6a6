"""`nvcli status`: what is hot-mounted in a pod."""

from __future__ import annotations

from typing import Annotated

import typer

from cli.options import Common
from cli.output import status_table
from cli.reach import make_client, namespace_of
from cli.wiring import (
    Name,
    check_modes,
    emit,
    local_engine,
    pick_target,
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
    # The reply as the agent sent it: rendered without pydantic or the models, which
    # would cost more than the request itself (bench/cli_bench.py).
    with make_client(opts) as client:
        if kind == "container":
            doc = client.container_status_document(target or "")
        else:
            doc = client.status_document(namespace_of(opts), target or "")
    if container and kind == "pod":
        doc["containers"] = [c for c in doc["containers"] if c.get("container") == container]
    if opts.fmt == "table":
        typer.echo(status_table(doc))
    else:
        emit(doc, opts)
