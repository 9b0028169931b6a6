"""What every nvcli command shares: kubectl's common flags (`with_common`), logging,
the modes (`--local`, `--agent`), the pod or container a command is about, and output.
Commands (cli/commands/) import this; it imports no command.

Start-up time is most of a call's wall time (docs/cli.md, "Start-up time"): this module imports
typer and the cheap hotmount.wire.errors and cli.output only. The client (cli.client,
cli.transport.http), pydantic and the agent's models, the kubeconfig reader and the engine
(cli.local) are imported by the commands that use them; tests/cli/test_imports.py holds that.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import fields
from pathlib import Path
from typing import Annotated, Any, get_type_hints

import typer

from cli.completion import complete_pods
from cli.explain import explain
from cli.klog import setup_logging
from cli.options import Common, OutputFormat
from cli.output import printable, render
from cli.reach import UsageError
from hotmount.wire.errors import DEFAULT_TIMEOUT, EXIT_USAGE, HotmountClientError

# -- options every command takes, kubectl's names -------------------------------------------


_COMMON_OPTIONS: dict[str, Any] = {
    "kubeconfig": Annotated[
        str | None,
        typer.Option(
            "--kubeconfig",
            metavar="PATH",
            help="kubeconfig file (default: $KUBECONFIG, then ~/.kube/config)",
            show_default=False,
        ),
    ],
    "context": Annotated[
        str | None, typer.Option("--context", metavar="NAME", help="kubeconfig context")
    ],
    "namespace": Annotated[
        str | None,
        typer.Option(
            "-n", "--namespace", metavar="NS", help="the pod's namespace (default: the context's)"
        ),
    ],
    "v": Annotated[
        int | None,
        typer.Option(
            "-v",
            "--v",
            metavar="LEVEL",
            min=0,
            max=10,
            help="log verbosity 0-10: 4 logs each HTTP call, 6 adds headers and bodies",
        ),
    ],
    "timeout": Annotated[
        str | None,
        typer.Option(
            "--timeout",
            metavar="DURATION",
            help=f"bound on each HTTP call: 30s, 2m, 1m30s; 0 waits forever "
            f"(default {int(DEFAULT_TIMEOUT)}s)",
        ),
    ],
    "output": Annotated[
        OutputFormat | None,
        typer.Option(
            "-o", "--output", metavar="table|json|yaml", help="output format (default table)"
        ),
    ],
    "agent": Annotated[
        str | None,
        typer.Option("--agent", metavar="URL", help="call this agent URL directly (its /v1 API)"),
    ],
    "token": Annotated[
        str | None, typer.Option("--token", metavar="TOKEN", help="bearer token for --agent")
    ],
    "token_file": Annotated[
        Path | None,
        typer.Option(
            "--token-file", metavar="PATH", help="file holding the bearer token for --agent"
        ),
    ],
    "certificate_authority": Annotated[
        Path | None,
        typer.Option(
            "--certificate-authority",
            metavar="PATH",
            help="CA that signed the --agent's certificate (default: the system's trust store)",
        ),
    ],
    "insecure_skip_tls_verify": Annotated[
        bool,
        typer.Option("--insecure-skip-tls-verify", help="do not verify the --agent's certificate"),
    ],
    "local": Annotated[
        bool,
        typer.Option("--local", help="run the engine in-process (no Kubernetes; needs root)"),
    ],
    "host_root": Annotated[
        Path | None,
        typer.Option("--host-root", metavar="DIR", help="--local: where the host's / is"),
    ],
    "cdi_dir": Annotated[
        list[str] | None,
        typer.Option("--cdi-dir", metavar="DIR", help="--local: CDI spec directory (repeatable)"),
    ],
    "state_dir": Annotated[
        Path | None,
        typer.Option("--state-dir", metavar="DIR", help="--local: the engine's ledger directory"),
    ],
}
_COMMON_DEFAULTS = {f.name: f.default for f in fields(Common)}


def with_common(func: Callable[..., None]) -> Callable[..., None]:
    """Add the common options to a command; it receives them as `opts: Common`."""
    hints = get_type_hints(func, include_extras=True)
    own = [
        p.replace(annotation=hints[p.name])
        for p in inspect.signature(func).parameters.values()
        if p.name != "opts"
    ]
    extra = [
        inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=_COMMON_DEFAULTS[name],
                          annotation=annotation)
        for name, annotation in _COMMON_OPTIONS.items()
    ]  # fmt: skip

    @functools.wraps(func)
    def wrapper(ctx: typer.Context, **kwargs: Any) -> None:
        common = Common(**{name: kwargs.pop(name) for name in _COMMON_OPTIONS})
        opts = common.merged(ctx.find_object(Common))
        if ctx.obj is None:  # the root callback: commands merge these with their own
            ctx.obj = opts
        setup_logging(opts.v or 0)
        try:
            func(opts=opts, **kwargs)
        except UsageError as err:
            typer.echo(ctx.get_usage(), err=True)
            typer.echo(f"Try '{ctx.command_path} -h' for help.\n", err=True)
            typer.echo(f"Error: {err}", err=True)
            raise typer.Exit(EXIT_USAGE) from None
        except HotmountClientError as err:
            typer.echo(f"error: {printable(explain(err, kwargs, opts))}", err=True)
            raise typer.Exit(err.exit_code) from None

    ctx_param = inspect.Parameter("ctx", inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                  annotation=typer.Context)  # fmt: skip
    params = [ctx_param, *own, *extra]
    wrapper.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    wrapper.__annotations__ = {p.name: p.annotation for p in params}
    return wrapper


# -- reaching the agent ---------------------------------------------------------------------------


def emit(result: Any, opts: Common) -> None:
    typer.echo(render(result, opts.fmt))


# -- what a command is about ------------------------------------------------------------

Name = Annotated[
    str | None,
    typer.Option("--name", metavar="POD", help="the pod", autocompletion=complete_pods),
]
Force = Annotated[bool, typer.Option("--force", help="stop processes holding the device")]


def local_engine(opts: Common) -> Any:
    """`--local`: the engine in this process (cli.local), imported only then."""
    from cli.local import LocalEngine

    return LocalEngine(opts)


def check_names(containers: list[str], share_with: str | None) -> None:
    """Name the flag, not the wire field, when a name cannot be one (before any request)."""
    from hotmount.wire.schemas import ContainerName, KubeName

    for value in containers:
        if value != "*" and not _valid(ContainerName, value):
            raise UsageError(
                f"--container {value!r} is not a container name "
                "(lower-case letters, digits and '-'), nor '*'"
            )
    if share_with is not None and not _valid(KubeName, share_with):
        raise UsageError(
            f"--share-with {share_with!r} is not a pod name: give a pod of the same "
            "namespace (lower-case letters, digits, '-' and '.'; no namespace/)"
        )


def _valid(kind: Any, value: str) -> bool:
    from pydantic import TypeAdapter, ValidationError

    try:
        TypeAdapter(kind).validate_python(value)
    except ValidationError:
        return False
    return True
