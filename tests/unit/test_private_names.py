"""No name starting with `_` is used outside the module that defines it (issue 41), in
hotmount/, agent/ and cli/: a private name is a module's own business, so another module
that reaches for it couples itself to what may change without notice.

The rule, kept simple enough to explain in one breath, read from the code with `ast`:

- `from m import _x`, where `m` is one of our modules and not this one, is flagged;
- `expr._x`, where `expr` is not `self` or `cls`, is flagged when `_x` is defined in
  another of our modules and nowhere in this one. Defined: assigned, a def or class,
  a parameter, an import alias, or `self._x = ...`. So `other._x` on an object of this
  module's own classes passes (the module defines `_x`), and a library's private name
  (`sys._getframe`) is not ours to judge.

Dunder names (`__init__`) are public.
"""

from __future__ import annotations

import ast
from collections.abc import Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("hotmount", "agent", "cli")

# Known exceptions, each to be removed (none today): the test fails on an entry that no
# longer occurs, so the list never outlives its reason.
KNOWN: frozenset[str] = frozenset()


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _defined(tree: ast.AST, *, imports: bool = True) -> set[str]:
    """The private names a module defines, by any of the ways the rule counts (with
    `imports`, its import aliases too: what it names itself, not what it offers)."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            found.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            found.add(node.id)
        elif isinstance(node, ast.arg):
            found.add(node.arg)
        elif isinstance(node, ast.alias) and imports:
            found.add(node.asname or node.name.split(".")[0])
        elif (
            isinstance(node, ast.Attribute)
            and isinstance(node.ctx, ast.Store)
            and isinstance(node.value, ast.Name)
            and node.value.id in ("self", "cls")
        ):
            found.add(node.attr)
    return {name for name in found if _private(name)}


def findings(sources: Mapping[str, str]) -> set[str]:
    """`module: name` for every use of another module's private name in `sources`
    (module name -> its code)."""
    trees = {module: ast.parse(code) for module, code in sources.items()}
    own = {module: _defined(tree) for module, tree in trees.items()}
    anywhere = set().union(*(_defined(tree, imports=False) for tree in trees.values()))
    out: set[str] = set()
    for module, tree in trees.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                if node.module.split(".")[0] in PACKAGES and node.module != module:
                    out |= {f"{module}: {a.name}" for a in node.names if _private(a.name)}
            elif isinstance(node, ast.Attribute) and _private(node.attr):
                if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                    continue
                if node.attr in anywhere and node.attr not in own[module]:
                    out.add(f"{module}: {node.attr}")
    return out


def _our_sources() -> dict[str, str]:
    return {
        _module_name(path): path.read_text()
        for package in PACKAGES
        for path in sorted((ROOT / package).rglob("*.py"))
    }


def test_no_private_name_is_used_outside_its_module() -> None:
    found = findings(_our_sources())
    assert sorted(found - KNOWN) == []
    assert sorted(KNOWN - found) == [], "no longer found: take them out of KNOWN"


def test_the_rule_flags_imports_and_attributes_of_other_modules_private_names() -> None:
    sources = {
        "hotmount.engine.core": (
            "_SECRET = 1\n"
            "class Engine:\n"
            "    def __init__(self):\n"
            "        self._proc = '/proc'\n"
            "    def _enter(self):\n"
            "        return self._proc\n"
            "def peek(other: Engine) -> str:\n"
            "    return other._proc\n"  # this module's own class: fine
        ),
        "hotmount.engine.suspension": (
            "from hotmount.engine.core import _SECRET\n"
            "from hotmount import engine\n"
            "import sys\n"
            "def suspend(e):\n"
            "    e._enter()\n"
            "    sys._getframe()\n"  # not one of ours
            "    e.__class__\n"
            "    return engine._SECRET\n"
        ),
    }
    assert findings(sources) == {
        "hotmount.engine.suspension: _SECRET",
        "hotmount.engine.suspension: _enter",
    }
