"""Kubeconfig YAML as kubectl and client-go write it, read without PyYAML: block
mappings and sequences of plain or simply quoted strings, `true`/`false`, `null`, `{}`
and `[]`. Importing PyYAML was a tenth of `nvcli status`'s start-up (bench/cli_bench.py).

`load` answers only where it is sure to give what `yaml.safe_load` gives: on anything
else (flow style, anchors, tags, block or multi-line scalars, escapes, comments after a
value, numbers, dates, tabs, documents) it returns NOT_PLAIN and the caller asks PyYAML,
whose errors stay the only ones. tests/cli/test_plainyaml.py holds the two to the same
result.
"""

from __future__ import annotations

import re
from typing import Any

NOT_PLAIN: Any = object()  # the text is not of this subset: ask PyYAML

_KEY = re.compile(r"([A-Za-z_][A-Za-z0-9_./-]*):(?: +(.*))?")
# A plain scalar that YAML 1.1 (PyYAML's resolver) reads as a string, or as a bool or
# null word: it starts with a letter, '_' or '/', so no number, date, merge or indicator.
_PLAIN = re.compile(r"[A-Za-z_/][A-Za-z0-9_./:@+=~%,-]*(?: [A-Za-z0-9_./:@+=~%,-]+)*")
_WORDS: dict[str, Any] = {
    **dict.fromkeys(("yes", "Yes", "YES", "true", "True", "TRUE", "on", "On", "ON"), True),
    **dict.fromkeys(("no", "No", "NO", "false", "False", "FALSE", "off", "Off", "OFF"), False),
    **dict.fromkeys(("null", "Null", "NULL"), None),
}


class _NotPlain(Exception):
    pass


def load(text: str) -> Any:
    """`yaml.safe_load(text)` for a plain kubeconfig (a mapping), else NOT_PLAIN."""
    if "\t" in text or "\r" in text or "\\" in text or "#" in text:
        return NOT_PLAIN
    lines = []
    for raw in text.split("\n"):
        stripped = raw.lstrip(" ")
        if stripped.rstrip(" "):
            lines.append([len(raw) - len(stripped), stripped.rstrip(" ")])
    if not lines or lines[0][0] != 0:
        return NOT_PLAIN
    try:
        value, end = _mapping(lines, 0, 0)
    except _NotPlain:
        return NOT_PLAIN
    return value if end == len(lines) else NOT_PLAIN


def _node(lines: list[list[Any]], i: int) -> tuple[Any, int]:
    indent, text = lines[i]
    if text == "-" or text.startswith("- "):
        return _sequence(lines, i, indent)
    return _mapping(lines, i, indent)


def _mapping(lines: list[list[Any]], i: int, indent: int) -> tuple[dict[str, Any], int]:
    found: dict[str, Any] = {}
    while i < len(lines) and lines[i][0] == indent and not lines[i][1].startswith("-"):
        match = _KEY.fullmatch(lines[i][1])
        if match is None:
            raise _NotPlain
        key, rest = _scalar(match[1]), match[2]
        if not isinstance(key, str) or key in found:
            raise _NotPlain  # a bool or null key, or a repeated one
        i += 1
        if rest:
            found[key] = _scalar(rest)
        elif i < len(lines) and (
            lines[i][0] > indent or (lines[i][0] == indent and lines[i][1].startswith("- "))
        ):
            found[key], i = _node(lines, i)
        else:
            found[key] = None
    return found, i


def _sequence(lines: list[list[Any]], i: int, indent: int) -> tuple[list[Any], int]:
    found: list[Any] = []
    while i < len(lines) and lines[i][0] == indent and lines[i][1].startswith("- "):
        rest = lines[i][1][2:]
        inner = indent + 2 + len(rest) - len(rest.lstrip(" "))
        rest = rest.lstrip(" ")
        if rest.startswith("-"):
            raise _NotPlain  # a sequence in a sequence's item
        if _KEY.fullmatch(rest):  # a mapping that starts on the item's line
            lines[i] = [inner, rest]
            item, i = _mapping(lines, i, inner)
        else:
            item, i = _scalar(rest), i + 1
        found.append(item)
    return found, i


def _scalar(text: str) -> Any:
    if text in ("{}", "[]"):
        return {} if text == "{}" else []
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "\"'":
        inner = text[1:-1]
        if text[0] in inner or not inner.isprintable():
            raise _NotPlain  # an escape or a doubled quote: PyYAML's to read
        return inner
    if ": " in text or text.endswith(":") or not _PLAIN.fullmatch(text):
        raise _NotPlain
    return _WORDS.get(text, text)
