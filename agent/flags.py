"""`hotmount-agent`'s command line, generated from the settings model with argparse.

pydantic-settings' own CLI printed Python types (`--listen list[str]`) and every
validation alias as another flag (`--node-name str, --node-name str, ...`). Here each
setting is one ordinary option: `--name METAVAR`, its help, its default; a list is a
repeatable option, a bool a `--x/--no-x` pair. Only the flags given are returned, so
the environment (HOTMOUNT_*) still fills the rest and pydantic still validates all.
"""

from __future__ import annotations

import argparse
import textwrap
from collections.abc import Sequence
from pathlib import Path
from types import NoneType, UnionType
from typing import Any, Union, get_args, get_origin

from pydantic import BaseModel
from pydantic.fields import FieldInfo

EPILOG = (
    "Every option can also come from the environment: --reconcile-interval 5 is "
    'HOTMOUNT_RECONCILE_INTERVAL=5, a list is JSON (HOTMOUNT_LISTEN=\'["a", "b"]\'). '
    "NODE_NAME and POD_NAMESPACE (the downward API) set --node-name and --agent-namespace. "
    "Flags win over the environment."
)


def _bare(annotation: Any) -> Any:
    """`X | None` -> X."""
    if get_origin(annotation) in (Union, UnionType):
        args = [a for a in get_args(annotation) if a is not NoneType]
        if len(args) == 1:
            return args[0]
    return annotation


def _metavar(name: str, info: FieldInfo, kind: Any) -> str:
    extra = info.json_schema_extra
    metavar = extra.get("metavar") if isinstance(extra, dict) else None
    if isinstance(metavar, str):
        return metavar
    if kind is float:
        return "SECONDS"
    if kind is int:
        return "N"
    word = name.rsplit("_", 1)[-1].upper()
    return word[:-1] if get_origin(info.annotation) is list and word.endswith("S") else word


def _shown(value: Any) -> str:
    if isinstance(value, list | tuple):
        return ", ".join(str(v) for v in value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def _help(info: FieldInfo, repeatable: bool) -> str:
    notes = ["repeatable"] if repeatable else []
    default = info.get_default(call_default_factory=True)
    text = info.description or ""
    if default not in (None, [], "") and "default" not in text:
        notes.append(f"default: {_shown(default)}")
    if notes:
        text += f" ({'; '.join(notes)})"
    return text.strip().replace("%", "%%")


class _Formatter(argparse.HelpFormatter):
    """Wide option column; paths and names are never split at their hyphens."""

    def __init__(self, prog: str) -> None:
        super().__init__(prog, max_help_position=32)

    def _split_lines(self, text: str, width: int) -> list[str]:
        return textwrap.wrap(text, width, break_on_hyphens=False, break_long_words=False)


def build_parser(model: type[BaseModel], prog: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description=(model.__doc__ or "").strip().splitlines()[0] if model.__doc__ else None,
        epilog=EPILOG,
        argument_default=argparse.SUPPRESS,
        formatter_class=_Formatter,
    )
    for name, info in model.model_fields.items():
        flag = "--" + name.replace("_", "-")
        annotation = _bare(info.annotation)
        if annotation is bool:
            parser.add_argument(
                flag, dest=name, action=argparse.BooleanOptionalAction, help=_help(info, False)
            )
            continue
        repeatable = get_origin(annotation) is list
        kind = get_args(annotation)[0] if repeatable else annotation
        parser.add_argument(
            flag,
            dest=name,
            metavar=_metavar(name, info, kind),
            action="append" if repeatable else "store",
            # None is argparse's own default (no conversion); typeshed leaves it out.
            type=Path if kind is Path else None,  # type: ignore[arg-type]
            help=_help(info, repeatable),
        )
    return parser


def given(model: type[BaseModel], argv: Sequence[str], prog: str) -> dict[str, Any]:
    """The settings named on the command line (argparse exits 2 on a bad one, 0 on -h)."""
    return vars(build_parser(model, prog).parse_args(list(argv)))
