"""What the wire package (hotmount/wire/) may reach at run time. pyproject.toml's
contracts keep the agent, the CLI, HTTP and Kubernetes out of it; this holds the rest:
of the engine only pure types (its error classes, and the network interface spec a
`MountRequest` carries), of the outside world only pydantic. (That nvcli's start-up
loads hotmount.wire.errors alone, without pydantic, tests/cli/test_imports.py holds.)"""

from __future__ import annotations

import sys

import grimp
import pytest

# The engine's modules the wire may reach: exception classes (engine_status tells them
# apart) and a pure, pydantic-only plan module (NetdevSpec, DEFAULT_INSIDE_NAME).
ENGINE_TYPES = {"hotmount.errors", "hotmount.netdev.plan"}


@pytest.fixture(scope="module")
def graph() -> grimp.ImportGraph:
    return grimp.build_graph(
        "hotmount",
        "agent",
        "cli",
        include_external_packages=True,
        exclude_type_checking_imports=True,
    )


def _outside(modules: set[str]) -> set[str]:
    """The top-level packages of `modules` that are neither ours nor the stdlib's."""
    tops = {m.split(".")[0] for m in modules}
    return tops - set(sys.stdlib_module_names) - {"hotmount", "agent", "cli"}


def test_the_wire_reaches_of_the_engine_only_pure_types(graph: grimp.ImportGraph) -> None:
    reached = graph.find_upstream_modules("hotmount.wire", as_package=True)
    assert {m for m in reached if m.startswith("hotmount.")} == ENGINE_TYPES
    assert not {m for m in reached if m.split(".")[0] in ("agent", "cli")}
    assert _outside(reached) == {"pydantic"}
