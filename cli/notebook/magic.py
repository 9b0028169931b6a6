"""The `%gpu` line magic: the line parsed into a `Command`, the call it asks for, and its
message printed (or one line on stderr: never a traceback under a cell)."""

from __future__ import annotations

import shlex
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from cli.notebook.calls import attach, cuda_initialised, detach, list_gpus, status
from cli.notebook.config import Config, NotebookError
from cli.notebook.messages import (
    attached_message,
    detached_message,
    error_message,
    list_message,
    status_message,
)

USAGE = (
    "usage: %gpu attach [N ... | --count N] [--idle 30m] [--once] | detach [N ... | --all]"
    " | status | list | suspend | resume"
)


@dataclass
class Command:
    action: str  # attach | detach | status | list | suspend | resume | help
    devices: list[str] = field(default_factory=list)
    count: int | None = None
    all: bool = False
    idle_timeout: str | None = None
    once: bool = False  # not mounted again if the notebook's container restarts


def parse(line: str) -> Command:
    """`attach 0 1`, `attach --count 2 --idle 30m`, `detach --all`, `status`, `list`."""
    try:
        words = shlex.split(line)
    except ValueError as exc:
        raise NotebookError(f"{exc}; {USAGE}") from exc
    if not words or words[0] in ("help", "-h", "--help"):
        return Command("help")
    action, rest = words[0], words[1:]
    if action not in ("attach", "detach", "status", "list", "suspend", "resume"):
        raise NotebookError(f"unknown command {action!r}; {USAGE}")
    command = Command(action)
    while rest:
        word = rest.pop(0)
        option, _, value = word.partition("=")
        if action == "attach" and option in ("--count", "-n", "--idle"):
            if not value:
                if not rest:
                    raise NotebookError(f"{option} needs a value; {USAGE}")
                value = rest.pop(0)
            if option == "--idle":
                command.idle_timeout = value
            elif not value.isdigit() or int(value) < 1:
                raise NotebookError(f"--count takes a number of GPUs (1, 2, ...), not {value!r}")
            else:
                command.count = int(value)
        elif action == "detach" and word == "--all":
            command.all = True
        elif action == "attach" and word == "--once":
            command.once = True
        elif word.startswith("-"):
            raise NotebookError(f"{action} has no option {word}; {USAGE}")
        elif action in ("attach", "detach"):
            command.devices.append(word)
        else:
            raise NotebookError(f"{action} takes no arguments; {USAGE}")
    if command.devices and command.count is not None:
        raise NotebookError("name GPUs or give --count, not both")
    if command.devices and command.all:
        raise NotebookError("name GPUs or give --all, not both")
    if action == "attach" and not command.devices and command.count is None:
        command.count = 1
    if action == "detach" and not command.devices:
        command.all = True
    return command


def run(line: str, config: Config | None = None, say: Callable[[str], None] | None = None) -> str:
    """Do what `%gpu <line>` asks; returns the message (errors raise, see `magic`).
    `say`: where a suspend's or resume's progress lines go while it runs."""
    command = parse(line)
    if command.action == "help":
        return USAGE
    config = config or Config.from_env()
    if command.action == "attach":
        result = attach(
            command.devices, command.count, command.idle_timeout, config, once=command.once
        )
        return attached_message(result, cuda_initialised(), config)
    if command.action == "detach":
        return detached_message(detach(None if command.all else command.devices, config))
    if command.action == "status":
        return status_message(status(config), config)
    if command.action in ("suspend", "resume"):
        from cli.notebook import suspend as ns

        if command.action == "suspend":
            return ns.suspended_message(ns.suspend(config, say))
        return ns.resumed_message(ns.resume(config, say=say))
    return list_message(list_gpus(config))


def magic(line: str, config: Config | None = None, stdout: Any = None, stderr: Any = None) -> bool:
    """`%gpu`: prints the message, or one line to stderr on any failure. True if it worked."""
    out, err = stdout or sys.stdout, stderr or sys.stderr
    action = (line.split(maxsplit=1) or [""])[0]
    try:
        print(run(line, config, lambda text: print(text, file=out, flush=True)), file=out)
    except Exception as exc:
        try:
            text = error_message(exc, config, action)
        except Exception:  # even a broken install gets its one line, not a traceback
            text = f"gpu-hotmount: {exc}"
        print(f"%gpu: {text}", file=err)
        return False
    return True
