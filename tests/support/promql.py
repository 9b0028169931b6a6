"""The metric names a PromQL expression (or a Grafana query) selects, and the sample names
a /metrics page really exports: what the monitoring tests compare.

No PromQL parser is packaged for Python, so names are found by removing what cannot be
one (strings, label matchers, ranges, label lists of by/without/on/ignoring/group_*,
Grafana's $variables, numbers and durations) and keeping the identifiers left that are
not a function call or a keyword. tests/unit/test_promql_names.py holds it to known
expressions.
"""

from __future__ import annotations

import re

from prometheus_client.parser import text_string_to_metric_families

KEYWORDS = frozenset({
    "by", "without", "on", "ignoring", "group_left", "group_right", "bool",
    "and", "or", "unless", "offset", "atan2", "inf", "nan",
})  # fmt: skip
_STRINGS = re.compile(r'"(?:\\.|[^"\\])*"|\'(?:\\.|[^\'\\])*\'|`[^`]*`')
_MATCHERS = re.compile(r"\{[^{}]*\}")
_RANGES = re.compile(r"\[[^\[\]]*\]")
_LABEL_LISTS = re.compile(
    r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)", re.IGNORECASE
)
_VARIABLES = re.compile(r"\$\{?\w+\}?")
_GRAFANA_LABEL_VALUES = re.compile(r"\blabel_values\s*\(\s*([^,()]*?)\s*,\s*\w+\s*\)")
_IDENTIFIER = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
HISTOGRAM_SUFFIXES = ("_bucket", "_count", "_sum")


def metric_names(expr: str) -> set[str]:
    """Every metric name `expr` selects (`x{...}`, `x[5m]`, `{__name__="x"}` aside)."""
    text = _STRINGS.sub(" ", expr)
    # Grafana's label_values(metric, label): the second argument is a label, not a metric.
    text = _GRAFANA_LABEL_VALUES.sub(lambda m: f" {m.group(1)} ", text)
    text = _VARIABLES.sub(" ", text)
    while True:  # nested matchers cannot occur, but strings removed may leave {} pairs
        stripped = _RANGES.sub(" ", _MATCHERS.sub(" ", text))
        if stripped == text:
            break
        text = stripped
    text = _LABEL_LISTS.sub(" ", text)
    names = set()
    for match in _IDENTIFIER.finditer(text):
        word = match.group()
        before = text[: match.start()]
        if before and (before[-1].isdigit() or before[-1] == "."):
            continue  # the unit of a duration or a number's exponent (5m, 1e3)
        if text[match.end() :].lstrip().startswith("("):
            continue  # a function or an aggregation
        if word.lower() in KEYWORDS:
            continue
        names.add(word)
    return names


def exported_names(exposition: str) -> set[str]:
    """The sample names a /metrics page serves, each family's by its type: a counter's
    `_total`, a histogram's `_bucket`/`_count`/`_sum`, a gauge's own name (a labelled
    family with no sample yet still counts: its TYPE line is there)."""
    names: set[str] = set()
    for family in text_string_to_metric_families(exposition):
        names.update(sample.name for sample in family.samples)
        if family.type == "counter":
            names.add(f"{family.name}_total")
        elif family.type == "histogram":
            names.update(family.name + suffix for suffix in HISTOGRAM_SUFFIXES)
        else:
            names.add(family.name)
    return names


def unexported(wanted: set[str], exported: set[str]) -> set[str]:
    """`wanted` names not in `exported`; a histogram's suffixed name counts as its family."""
    missing = set()
    for name in wanted:
        if name in exported:
            continue
        base = next((name[: -len(s)] for s in HISTOGRAM_SUFFIXES if name.endswith(s)), None)
        if base is None or f"{base}_bucket" not in exported:
            missing.add(name)
    return missing
