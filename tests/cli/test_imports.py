"""nvcli's start-up stays cheap: each command imports only what it uses.

Most of an nvcli call's wall time is the interpreter starting and importing (issue 10),
so the structure that keeps it low is held here, by module, not by time (no timed
tests): a new process runs nvcli's own `main()` and reports what it imported.
bench/cli_bench.py measures the time itself.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import cli
from tests.cli.conftest import AGENT_TOKEN, Cluster
from tests.cli.stub_agent import StubAgent

REPO = Path(__file__).resolve().parents[2]

# What `import cli.main` must not pull in; each costs tens of milliseconds or more.
HEAVY = (
    "kubernetes",  # the official client: only for exec and auth-provider kubeconfigs
    "rich",  # typer's pretty output: nvcli prints plain text
    "pygments",  # with rich
    "httpx",  # the agent's HTTP client; nvcli's is cli/transport/http.py
    "pydantic",
    "agent",  # the agent's models, built at import
    "hotmount",  # the engine: --local only (and the wire's models: see AT_START)
    "yaml",
    "importlib.metadata",
)
# Never, whatever the command: the output and the kubeconfig do not need them, and
# nvcli speaks HTTP with the standard library's http.client (cli/transport/http.py).
NEVER = ("kubernetes", "rich", "pygments", "hotmount.engine.core", "httpx", "httpcore", "h11")
# Not for `nvcli status`, which renders the agent's JSON as it came.
MODELS = ("pydantic", "hotmount.wire.schemas")

# The wire's exit codes and error tree (hotmount/wire/errors.py, standard library only)
# load at start, with their packages: nothing else of `hotmount` does.
AT_START = frozenset({"hotmount", "hotmount.wire", "hotmount.wire.errors"})

# Not typer or click either: a plain `nvcli status` is parsed without them
# (cli/statusline.py), which were a third of its start-up.
QUICK = ("typer", "click")

# Output to files, as to a terminal or a pipe (the quick path leaves an io.StringIO,
# which has no encoding, to typer).
PROBE = """
import contextlib, json, sys, tempfile
import cli.main
args = json.loads(sys.argv[1])
with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = cli.main.main(args) if args is not None else 0
    out.seek(0), err.seek(0)
    print(json.dumps({"rc": rc, "out": out.read(), "err": err.read(),
                      "modules": sorted(k for k, v in sys.modules.items() if v is not None)}))
"""


def run_nvcli(*args: str, import_only: bool = False) -> dict:
    """nvcli's `main()` in a new interpreter; its exit code, output and `sys.modules`."""
    env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG" and "proxy" not in k.lower()}
    done = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(None if import_only else list(args))],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        cwd=REPO,
        check=True,
    )
    return json.loads(done.stdout)


def loaded(result: dict, packages: tuple[str, ...]) -> list[str]:
    """Which of `packages` (or modules under them) the run imported, AT_START aside."""
    modules = [m for m in result["modules"] if m not in AT_START]
    return [p for p in packages if any(m == p or m.startswith(f"{p}.") for m in modules)]


def test_importing_nvcli_imports_nothing_heavy() -> None:
    assert loaded(run_nvcli(import_only=True), (*HEAVY, *QUICK)) == []


def test_help_and_version_import_nothing_heavy() -> None:
    """Not even pydantic: typer 0.26 and later would import it to parse any flag."""
    for args, text in (
        (["--help"], "Usage: nvcli"),
        ([], "Usage: nvcli"),  # no arguments: the help, exit 2
        (["status", "--help"], "Usage: nvcli status"),
        (["mount", "-h"], "Usage: nvcli mount"),
        (["version"], "nvcli "),
        (["version", "-o", "json"], '"clientVersion"'),
    ):
        result = run_nvcli(*args)
        assert result["rc"] in (0, 2) and text in result["out"] + result["err"], result
        assert loaded(result, HEAVY) == [], args
    assert "hotmount.wire.errors" in result["modules"]  # what AT_START lets through


def test_a_command_loads_its_own_module_only() -> None:
    """The root registers only the commands the line names (cli/commands/): `status`
    and `version` load no other command's module; `--help` and a line that names none
    register them all, so the help lists every command."""
    others = tuple(f"cli.commands.{m}" for m in ("mount", "unmount", "listing", "move"))
    for args in (["status", "--help"], ["version"], ["-n", "ml", "version", "-o", "json"]):
        result = run_nvcli(*args)
        assert result["rc"] == 0, result
        assert loaded(result, others) == [], args
    everything = run_nvcli("--help")
    for verb in ("mount", "unmount", "status", "list", "move", "version", "completion"):
        assert f"\n  {verb} " in everything["out"], verb
    typo = run_nvcli("stauts")
    assert typo["rc"] == 2 and "Did you mean 'status'?" in typo["err"], typo


def test_status_direct_to_an_agent(stub: StubAgent) -> None:
    result = run_nvcli(
        "status", "--name", "nb-0", "-n", "ml", "--agent", stub.url, "--token", AGENT_TOKEN
    )
    assert result["rc"] == 0, result
    assert result["out"].startswith("POD")
    assert loaded(result, NEVER) == []
    # A table, the namespace given: no kubeconfig to read.
    assert loaded(result, ("yaml", "cli.transport.kubeconfig")) == []
    # The reply rendered as it came: no models built (they cost more than the request).
    assert loaded(result, MODELS) == []
    assert loaded(result, QUICK) == []


def test_static_kubeconfigs_do_not_load_the_kubernetes_client(cluster: Cluster) -> None:
    dave = cluster.ca.issue_client("dave", groups=["ml-team"])
    for config in (
        cluster.kubeconfig("token", namespace="ml", token="alice-token"),
        cluster.kubeconfig("cert", namespace="ml", cert=dave),
    ):
        result = run_nvcli("status", "--name", "nb-0", "--kubeconfig", str(config))
        assert result["rc"] == 0, result
        assert loaded(result, NEVER) == [], config.name
        assert loaded(result, MODELS) == [], config.name
        assert loaded(result, QUICK) == [], config.name
    assert [r.header("x-remote-user") for r in cluster.agent.received] == ["alice", "dave"]


def test_an_exec_plugin_kubeconfig_uses_the_kubernetes_client(cluster: Cluster) -> None:
    """The other side of the line: a plugin is run by the official loader."""
    from tests.cli.test_aggregated import exec_kubeconfig

    config = exec_kubeconfig(cluster, "alice-token")
    result = run_nvcli("status", "--name", "nb-0", "--kubeconfig", str(config))
    assert result["rc"] == 0, result
    assert loaded(result, ("kubernetes",)) == ["kubernetes"]
    assert cluster.agent.received[-1].header("x-remote-user") == "alice"


def test_the_version_literal_is_the_distribution_version() -> None:
    """`cli.__version__` is a literal (no importlib.metadata at start): it must not drift."""
    from importlib.metadata import version

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert cli.__version__ == project["version"] == version("gpu-hotmount")
