"""`nvcli completion bash|zsh`: the shell code that completes commands and names."""

from __future__ import annotations

from typing import Annotated

import typer

from cli.completion import SHELLS
from cli.names import PLUGIN_NAME
from hotmount.wire.errors import EXIT_USAGE


def completion(
    ctx: typer.Context,
    shell: Annotated[str, typer.Argument(metavar="bash|zsh", help="the shell")],
) -> None:
    """Print the shell code that completes commands, flags, pods and GPUs.

    \b
    Example:
      nvcli completion bash > ~/.local/share/bash-completion/completions/nvcli
      echo 'source <(nvcli completion zsh)' >> ~/.zshrc
    """
    from typer.completion import completion_init

    from cli.completion import script

    if shell not in SHELLS:
        typer.echo(f"Error: no completion for {shell!r}: use one of {', '.join(SHELLS)}", err=True)
        raise typer.Exit(EXIT_USAGE)
    completion_init()  # typer's classes for each shell, which its completion answers with
    root = ctx.find_root()
    executable = "kubectl-gpu" if root.info_name == PLUGIN_NAME else "nvcli"
    typer.echo(script(root.command, shell, executable), nl=False)


# kubectl runs a plugin `kubectl gpu ARGS` as the executable `kubectl-gpu` on PATH, with
