"""nvcli's commands, one module each, imported only when chosen (pip's table of command
names to modules, ../shared/STYLE.md): `nvcli status` loads neither mount's nor move's
code, and typer builds only the commands registered.

The root (cli/main.py) registers the commands that the command line names, or all of
them for `--help`, shell completion, or a line that names none (click's "No such
command" then suggests one)."""

from __future__ import annotations

import importlib
import os
from collections.abc import Sequence

import typer

# verb -> (module, function); in the order `nvcli --help` lists them
COMMANDS = {
    "mount": ("cli.commands.mount", "mount"),
    "unmount": ("cli.commands.unmount", "unmount"),
    "status": ("cli.commands.status", "status"),
    "list": ("cli.commands.listing", "list_"),
    "move": ("cli.commands.move", "move"),
    "suspend": ("cli.commands.suspend", "suspend"),
    "resume": ("cli.commands.suspend", "resume"),
    "acquire": ("cli.commands.ondemand", "acquire"),
    "release": ("cli.commands.ondemand", "release"),
    "version": ("cli.commands.version", "version"),
    "completion": ("cli.commands.completion", "completion"),
}


def chosen(args: Sequence[str], completing: str | None = None) -> list[str]:
    """The verbs to register for `args`: every word that is a verb (flags may come
    before the verb and take values, kubectl's way: `-n mount unmount` registers both,
    and click picks), else all of them; all while the shell completes (`completing`,
    the completion variable, is set)."""
    if completing and os.environ.get(completing):
        return list(COMMANDS)
    named = [verb for verb in COMMANDS if verb in args]
    return named or list(COMMANDS)


def register(app: typer.Typer, verbs: Sequence[str]) -> None:
    """Add `verbs` that are not there yet, keeping the table's order."""
    there = {info.name for info in app.registered_commands}
    for verb in verbs:
        if verb not in there:
            module, function = COMMANDS[verb]
            app.command(verb)(getattr(importlib.import_module(module), function))
    order = list(COMMANDS)
    app.registered_commands.sort(key=lambda info: order.index(info.name or ""))
