"""Shell completion: the script `nvcli completion bash|zsh` prints, and the completers
that name pods and GPUs while a command line is typed.

The script is click's (through typer, which registers its own classes for each shell):
the shell runs nvcli again with `_NVCLI_COMPLETE` set and the words typed so far, and
nvcli prints the candidates. Subcommands and flags complete from the command tree at no
cost; `--name` asks the API server for the namespace's pods and `--mount`/`--unmount`
ask the agent for GPUs, each one call bounded by a short timeout. A completer never
prints an error into the user's prompt: anything that fails completes to nothing.

This module is imported with cli.app, so it imports nothing that costs start-up time
at import (the client and the kubeconfig reader come in only when a completer runs).
It imports click: `nvcli status`'s quick path (cli/statusline.py) does not import it.
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, Any

import click  # typer's own dependency, loaded with it: costs nothing more

from cli.names import complete_var

if TYPE_CHECKING:
    from cli.client import HotmountClient

SHELLS = ("bash", "zsh")
# A completion waits for at most this long on the network: a prompt must not hang.
COMPLETION_TIMEOUT = "3s"
log = logging.getLogger("nvcli")


def script(command: click.Command, shell: str, executable: str) -> str:
    """The shell code that completes the command `executable` (`nvcli`, `kubectl-gpu`)."""
    from click.shell_completion import get_completion_class

    completion = get_completion_class(shell)
    if completion is None:
        raise ValueError(f"no completion for {shell!r}: use one of {', '.join(SHELLS)}")
    source = completion(command, {}, executable, complete_var(executable)).source()
    # zsh reads `#compdef` only on a file's first line (a file in $fpath, as `_nvcli`).
    return source.lstrip("\n")


def _client(ctx: click.Context) -> HotmountClient:
    """The client the command itself would build, from the flags typed so far."""
    from cli.options import Common
    from cli.reach import make_client

    params: dict[str, Any] = {}
    for level in reversed(list(_lineage(ctx))):  # the root first: the command's flags win
        params.update({k: v for k, v in level.params.items() if v not in (None, False)})
    names = set(Common.__dataclass_fields__)
    opts = Common(**{k: v for k, v in params.items() if k in names})
    opts.timeout = COMPLETION_TIMEOUT
    return make_client(opts)


def _lineage(ctx: click.Context) -> list[click.Context]:
    found: list[click.Context] = []
    level: click.Context | None = ctx
    while level is not None:
        found.append(level)
        level = level.parent
    return found


def _namespace(ctx: click.Context) -> str:
    from cli.transport.kubeconfig import context_namespace

    for level in _lineage(ctx):
        if level.params.get("namespace"):
            return str(level.params["namespace"])
    root = _lineage(ctx)[-1].params
    return context_namespace(ctx.params.get("kubeconfig") or root.get("kubeconfig"),
                             ctx.params.get("context") or root.get("context"))  # fmt: skip


def _quietly(find: Any) -> Any:
    """A completer that completes to nothing, silently, when it cannot reach the cluster."""

    def completer(ctx: click.Context, incomplete: str) -> list[str]:
        if os.environ.get("NVCLI_NO_REMOTE_COMPLETION"):
            return []
        try:
            found = find(ctx)
        except Exception as exc:  # a prompt is no place for a traceback
            log.debug("completion: %s", exc)
            return []
        return [value for value in found if value.startswith(incomplete)]

    completer.__doc__ = find.__doc__
    return completer


@_quietly
def complete_pods(ctx: click.Context) -> list[str]:
    """Pods of the namespace the command line names (or the context's)."""
    with _client(ctx) as client:
        return client.pod_names(_namespace(ctx))


@_quietly
def complete_gpus(ctx: click.Context) -> list[str]:
    """GPU indices the agents list, each once."""
    with _client(ctx) as client:
        lists = client.list_devices()
    indices = {
        str(d.index)
        for listing in lists
        for d in listing.devices
        if d.kind == "gpu" and d.index is not None
    }
    return sorted(indices, key=int)


@_quietly
def complete_mounted(ctx: click.Context) -> list[str]:
    """The devices hot-mounted into the pod that `--name` names."""
    name = ctx.params.get("name")
    if not name:
        return []
    with _client(ctx) as client:
        document = client.status_document(_namespace(ctx), name)
    keys = {
        str(d.get("index") if d.get("index") is not None else d.get("key"))
        for container in document.get("containers", [])
        for d in container.get("devices", [])
    }
    return sorted(keys)
