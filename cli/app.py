"""nvcli's typer application: the root with the flags every command takes, and the
commands (cli/commands/, each imported when chosen). cli/main.py runs it for every
command line but a plain `nvcli status`, which cli/statusline.py answers without typer.

The root only registers commands and holds the common flags (cli/wiring.py): start-up
time is most of a call's wall time (docs/cli.md, "Start-up time"); tests/cli/test_imports.py
holds what each command loads.
"""

from __future__ import annotations

import sys

import typer

from cli import commands
from cli.names import complete_var
from cli.options import Common
from cli.wiring import with_common

app = typer.Typer(
    name="nvcli",
    help="Hot-mount GPUs into running pods, and take them away, without a restart.\n\n"
    "Example:\n\n  nvcli mount --name notebook-0 --mount 0",
    rich_markup_mode=None,
    pretty_exceptions_enable=False,
    no_args_is_help=True,
    context_settings={"help_option_names": ["-h", "--help"]},
)


@app.callback()
@with_common
def _root(opts: Common) -> None:
    """Hot-mount GPUs into running pods, and take them away, without a restart.

    Flags may come before or after the command, as with kubectl.

    \b
    Example:
      nvcli mount --name notebook-0 --mount 0
    """


def run(args: list[str], name: str) -> int:
    """The command line `args` through typer, as the program `name`; the exit status."""
    try:
        commands.register(app, commands.chosen(args, complete_var(name)))
        app(args=args, prog_name=name, complete_var=complete_var(name), standalone_mode=True)
    except SystemExit as exc:
        code = exc.code
        if code is None:
            return 0
        if isinstance(code, int):
            return code
        print(code, file=sys.stderr)
        return 1
    return 0
