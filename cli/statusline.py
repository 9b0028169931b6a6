"""`nvcli status` without typer and click: a plain status line is parsed here and
answered by the same code the typer command runs (`show`), since importing typer and
click is about a third of the start-up that is most of a status's time
(bench/cli_bench.py).

Plain means only these flags, each once, with a value that needs no conversion a
reader could doubt: the common flags before or after `status` (kubectl's way), `--name`
and `--container` after it. Anything else (`--help`, `--local`, an unknown or repeated
flag, a value that looks like a flag, `--`, a usage error, shell completion) returns
None, and typer parses the line as it parses any other: its errors and help stay the
only ones. tests/cli/test_statusline.py holds both paths to the same result.
"""

from __future__ import annotations

import codecs
import contextlib
import errno
import os
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cli.names import complete_var
from cli.options import Common, OutputFormat

# flag -> (field, converter): the common flags (cli/wiring.py's _COMMON_OPTIONS), by
# kubectl's names; no `--local` or its flags (the engine is not this path's)
_VALUE_FLAGS: dict[str, tuple[str, Callable[[str], Any] | None]] = {
    "--kubeconfig": ("kubeconfig", None),
    "--context": ("context", None),
    "-n": ("namespace", None),
    "--namespace": ("namespace", None),
    "-v": ("v", None),
    "--v": ("v", None),
    "--timeout": ("timeout", None),
    "-o": ("output", None),
    "--output": ("output", None),
    "--agent": ("agent", None),
    "--token": ("token", None),
    "--token-file": ("token_file", Path),
    "--certificate-authority": ("certificate_authority", Path),
}
_BOOL_FLAGS = {"--insecure-skip-tls-verify": "insecure_skip_tls_verify"}
_STATUS_FLAGS = {"--name": "name", "--container": "container"}  # status's own
_VERBOSITY = range(0, 11)  # -v's bounds, as typer's IntRange(0, 10)
# click.echo's: styles are stripped when the stream is not a terminal
_ANSI = re.compile(r"\033\[[0-?]*[ -/]*[@-~]")


@dataclass(frozen=True)
class StatusLine:
    opts: Common  # the flags after `status` merged over those before it
    name: str | None
    container: str | None
    program: str


def parse(args: list[str], program: str = "nvcli") -> StatusLine | None:
    """The status line `args`, or None when typer must parse it."""
    if "status" not in args or os.environ.get(complete_var(program)) or not _plain_streams():
        return None
    before: dict[str, Any] = {}
    after: dict[str, Any] = {}
    own: dict[str, str] = {}
    seen_verb = False
    words = iter(args)
    for word in words:
        if word == "status" and not seen_verb:
            seen_verb = True
            continue
        flag, eq, attached = word.partition("=") if word.startswith("--") else (word, "", "")
        where = after if seen_verb else before
        if flag in _BOOL_FLAGS and not eq:
            field, value = _BOOL_FLAGS[flag], True
        elif flag in _VALUE_FLAGS or (seen_verb and flag in _STATUS_FLAGS):
            value = attached if eq else next(words, None)
            if not value or value.startswith("-"):
                return None  # missing, empty or flag-like: typer's call
            if flag in _STATUS_FLAGS:
                field, where = _STATUS_FLAGS[flag], own
            else:
                field, convert = _VALUE_FLAGS[flag]
                value = _converted(field, value, convert)
                if value is None:
                    return None
        else:
            return None  # not a flag of this path, a second verb, a stray word
        if field in where:
            return None  # repeated: typer's call
        where[field] = value
    if not seen_verb:
        return None
    opts = Common(**after).merged(Common(**before))
    return StatusLine(opts, own.get("name"), own.get("container"), program)


def _converted(field: str, value: str, convert: Callable[[str], Any] | None) -> Any:
    """`value` as typer would give it, or None where typer might see it otherwise."""
    if field == "v":
        if not (value.isascii() and value.isdigit()) or int(value) not in _VERBOSITY:
            return None
        return int(value)
    if field == "output":
        return OutputFormat(value) if value in OutputFormat.__members__ else None
    return convert(value) if convert else value


def _plain_streams() -> bool:
    """click rewrites output to a stream that claims ASCII; typer does that, then."""
    for stream in (sys.stdout, sys.stderr):
        encoding = getattr(stream, "encoding", None)
        if stream is None or not encoding or codecs.lookup(encoding).name == "ascii":
            return False
    return True


def echo(text: str, err: bool = False) -> None:
    """click.echo's output, for text: a newline, styles stripped off a terminal, flushed."""
    stream = sys.stderr if err else sys.stdout
    out = text + "\n"
    if not stream.isatty():
        out = _ANSI.sub("", out)
    stream.write(out)
    stream.flush()


def show(opts: Common, kind: str, target: str, container: str | None, out: Callable) -> None:
    """What is hot-mounted in the pod or container `target`, printed with `out`: the
    reply as the agent sent it, rendered without pydantic or the models, which would cost
    more than the request itself (bench/cli_bench.py)."""
    from cli.output import render, status_table
    from cli.reach import make_client, namespace_of

    with make_client(opts) as client:
        if kind == "container":
            doc = client.container_status_document(target)
        else:
            doc = client.status_document(namespace_of(opts), target)
    if container and kind == "pod":
        doc["containers"] = [c for c in doc["containers"] if c.get("container") == container]
    out(status_table(doc) if opts.fmt == "table" else render(doc, opts.fmt))


def run(line: StatusLine) -> int | None:
    """The status, as typer's command and with_common would run it; None on a usage
    error (typer then prints it with the usage, as for any command)."""
    from cli.klog import setup_logging
    from cli.reach import UsageError, check_modes, pick_target
    from hotmount.wire.errors import HotmountClientError

    setup_logging(line.opts.v or 0)
    try:
        check_modes(line.opts)
        kind, target = pick_target(line.opts, line.name, line.container)
        show(line.opts, kind, target or "", line.container, echo)
    except UsageError:
        return None
    except HotmountClientError as err:
        from cli.explain import explain
        from cli.output import printable

        args = {"name": line.name, "container": line.container}
        echo(f"error: {printable(explain(err, args, line.opts))}", err=True)
        return err.exit_code
    except EOFError:
        echo("", err=True)
        echo("Aborted!", err=True)
        return 1
    except KeyboardInterrupt:
        return 130
    except OSError as exc:
        if exc.errno != errno.EPIPE:
            raise
        _quiet_streams()
        return 1
    return 0


def _quiet_streams() -> None:
    """After a closed pipe, as click: no second error when Python flushes at exit."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            os.dup2(devnull, stream.fileno())
    os.close(devnull)
