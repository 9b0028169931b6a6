"""`nvcli`: hot-mount GPUs into running pods, from a laptop with a kubeconfig.

Wiring only: flags are parsed here, the work is done by `cli.client` (through the
API server's aggregated API, or straight to an agent with `--agent`) or by the
engine in-process (`--local`). Exit codes, for scripts:

    0 success   1 error   2 usage or bad request   3 busy or conflict
    4 not found   5 unauthenticated or forbidden (or --local without root)   6 timeout

`nvcli list` exits 0 with the nodes that answered when some did not: each of those is a
`warning:` line on stderr, and an entry with `unavailable` in `-o json`/`-o yaml`.
"""

from __future__ import annotations

import sys
from pathlib import Path

import typer

from cli import commands
from cli.completion import complete_var
from cli.options import Common
from cli.wiring import PLUGIN_NAME, with_common

# The root only registers commands (cli/commands/, each imported when chosen) and holds
# the flags every command takes (cli/wiring.py): start-up time is most of a call's wall
# time (docs/api.md, "nvcli"); tests/cli/test_imports.py holds what each command loads.

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


def program_name(argv0: str) -> str:
    """`kubectl gpu` when run as the kubectl plugin (its usage lines say so), else nvcli."""
    return PLUGIN_NAME if Path(argv0).name.startswith("kubectl-gpu") else "nvcli"


def main(argv: list[str] | None = None) -> int:
    """The `nvcli` and `kubectl-gpu` console scripts; returns (and exits with) the status."""
    try:
        name = program_name(sys.argv[0])
        args = sys.argv[1:] if argv is None else argv
        commands.register(app, commands.chosen(args, complete_var(name)))
        app(args=argv, prog_name=name, complete_var=complete_var(name), standalone_mode=True)
    except SystemExit as exc:
        code = exc.code
        if code is None:
            return 0
        if isinstance(code, int):
            return code
        print(code, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
