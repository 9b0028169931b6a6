"""`nvcli status`'s quick path (cli/statusline.py) answers as typer's command does.

The same command lines, against the same stub agent and fake API server, once through
`cli.main.main` (the quick path where it takes the line) and once through typer alone
(`cli.app.run`): exit code, output and errors must be the same. Lines the quick path
must leave to typer are named, and so are the modules it must not load.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cli import statusline
from cli.options import Common, OutputFormat
from tests.cli.conftest import AGENT_TOKEN, Cluster
from tests.cli.stub_agent import StubAgent

REPO = Path(__file__).resolve().parents[2]

# Each line of argv (JSON) through one path, in one interpreter; the results and modules.
# Output to files (with an encoding, as a terminal's or a pipe's; click's rules for an
# io.StringIO are not the quick path's: it leaves those streams to typer).
PROBE = """
import contextlib, json, sys, tempfile
lines = json.loads(sys.argv[2])
if sys.argv[1] == "quick":
    from cli.main import main as nvcli
else:
    from cli.app import run
    nvcli = lambda args: run(args, "nvcli")
results = []
for args in lines:
    with tempfile.TemporaryFile("w+", encoding="utf-8") as out, \\
            tempfile.TemporaryFile("w+", encoding="utf-8") as err:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = nvcli(args)
        out.seek(0), err.seek(0)
        results.append({"rc": rc, "out": out.read(), "err": err.read(),
                        "typer": "typer" in sys.modules})
print(json.dumps({"results": results, "modules": sorted(sys.modules)}))
"""


def through(path: str, lines: list[list[str]]) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG" and "proxy" not in k.lower()}
    done = subprocess.run(
        [sys.executable, "-c", PROBE, path, json.dumps(lines)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=REPO,
        check=True,
    )
    return json.loads(done.stdout)


def test_the_quick_path_answers_as_typer(cluster: Cluster, stub: StubAgent) -> None:
    config = str(cluster.kubeconfig("token", namespace="ml", token="alice-token"))
    direct = ["--agent", stub.url, "--token", AGENT_TOKEN]
    lines = [
        ["status", "--name", "nb-0", "--kubeconfig", config],
        ["--kubeconfig", config, "status", "--name", "nb-0", "-o", "json"],
        ["-n", "ml", "status", "--name", "nb-0", f"--kubeconfig={config}", "-o", "yaml"],
        ["-o", "json", "--kubeconfig", config, "status", "--name", "nb-0", "-o", "table"],
        ["status", "--name", "nb-0", "--kubeconfig", config, "--container", "side"],
        ["status", "--name", "nb-0", "--kubeconfig", config, "--container", "nope"],
        ["status", "--name", "nb-0", "--kubeconfig", config, "--timeout", "5s", "-v", "0"],
        ["status", "--name", "nb-0", "-n", "other", "--kubeconfig", config],  # 403
        ["status", "--name", "nb-0", "--kubeconfig", str(cluster.directory / "absent")],
        ["status", "--name", "nb-0", "-n", "ml", *direct],
        ["status", "--name", "nb-0", "-n", "ml", "--agent", stub.url, "--token", "wrong"],
        ["status", "--container", "c" * 64, *direct, "-o", "json"],
        # usage errors last: the quick path leaves them to typer, which prints them
        ["status", "--name", "nb-0", "--kubeconfig", config, "--timeout", "soon"],
        ["status", "--kubeconfig", config],  # no --name
        ["status", "--name", "nb-0", "--kubeconfig", config, "--token", "t"],
    ]
    assert all(statusline.parse(line) is not None for line in lines)
    quick, typer = through("quick", lines), through("typer", lines)
    for line, mine, theirs in zip(lines, quick["results"], typer["results"], strict=True):
        assert (mine["rc"], mine["out"], mine["err"]) == (
            theirs["rc"],
            theirs["out"],
            theirs["err"],
        ), line
    codes = [r["rc"] for r in quick["results"]]
    assert codes == [0, 0, 0, 0, 0, 0, 0, 5, 1, 0, 5, 0, 2, 2, 2], quick["results"]
    assert "POD" in quick["results"][0]["out"] and "error: " in quick["results"][7]["err"]
    assert "Usage: nvcli status" in quick["results"][-1]["err"]
    # The quick path answered all but the usage errors without typer; typer printed those.
    assert [r["typer"] for r in quick["results"]] == [False] * 12 + [True] * 3


def test_a_plain_status_loads_no_typer(cluster: Cluster) -> None:
    config = str(cluster.kubeconfig("token", namespace="ml", token="alice-token"))
    quick = through("quick", [["status", "--name", "nb-0", "--kubeconfig", config]])
    assert quick["results"][0]["rc"] == 0
    heavy = ("typer", "click", "pydantic", "hotmount.wire.schemas")
    assert [m for m in quick["modules"] if m.split(".")[0] in heavy or m in heavy] == []


@pytest.mark.parametrize(
    "line",
    [
        ["status", "--help"],
        ["status", "-h"],
        ["status", "--name"],
        ["status", "--name", ""],
        ["status", "--name", "-n"],
        ["status", "--name", "a", "--name", "b"],
        ["status", "--name", "a", "extra"],
        ["status", "--", "--name", "a"],
        ["status", "--name", "a", "--local"],
        ["status", "--container", "x", "--local", "--state-dir", "/tmp"],
        ["--name", "a", "status"],  # --name is status's, not the root's
        ["status", "--name", "a", "-v", "11"],
        ["status", "--name", "a", "-v", "+4"],
        ["status", "--name", "a", "-o", "JSON"],
        ["status", "--name", "a", "-nml"],
        ["status", "--name", "a", "--insecure-skip-tls-verify=true"],
        ["status", "--name=a", "--bogus"],
        ["mount", "status", "--name", "a"],
        ["status", "status", "--name", "a"],
        ["version"],
    ],
)
def test_lines_left_to_typer(line: list[str]) -> None:
    assert statusline.parse(line) is None


def test_flags_after_the_verb_win() -> None:
    line = statusline.parse(
        ["-n", "a", "-v", "4", "-o", "json", "status", "-n", "b", "--name=nb", "--v=6"]
    )
    assert line is not None and (line.name, line.container) == ("nb", None)
    assert line.opts == Common(namespace="b", v=6, output=OutputFormat.json)


def test_shell_completion_is_left_to_typer(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("_NVCLI_COMPLETE", "bash_complete")
    assert statusline.parse(["status", "--name", "a"]) is None
    monkeypatch.setenv("_KUBECTL_GPU_COMPLETE", "bash_complete")
    assert statusline.parse(["status", "--name", "a"], "kubectl gpu") is None
