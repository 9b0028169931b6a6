"""`nvcli version`."""

from __future__ import annotations

import typer

from cli import __version__
from cli.options import Common
from cli.wiring import (
    emit,
    with_common,
)


@with_common
def version(opts: Common) -> None:
    """Print nvcli's version.

    \b
    Example:
      nvcli version
      nvcli version -o json
    """
    if opts.fmt == "table":
        typer.echo(f"nvcli {__version__}")
        return
    emit({"clientVersion": {"version": __version__}}, opts)
