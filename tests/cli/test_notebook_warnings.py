"""The reclaim warning in a notebook (issue 20): `%gpu status` says "reclaimed in 4m unless
used", and a real IPython shell that loaded the extension prints the warning after the
next cell, once per warning, and nothing at all when the agent cannot answer.

The agent is the stub agent over real HTTP; the shell finds it the way it does in a pod,
from GPU_HOTMOUNT_* (tests/cli/test_notebook_agent.py has the real agent)."""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path

import pytest

from cli import notebook
from cli.notebook import Config
from tests.cli.conftest import AGENT_TOKEN
from tests.cli.stub_agent import GPUS, StubAgent

POD = ("team-a", "jupyter-alice")
STATUS_PATH = "/v1/namespaces/team-a/pods/jupyter-alice/devices"


@pytest.fixture
def in_pod(stub: StubAgent, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Config:
    """The environment `%gpu` reads inside the notebook's pod, pointing at the stub."""
    token = tmp_path / "token"
    token.write_text(AGENT_TOKEN)
    env = {
        "GPU_HOTMOUNT_AGENT": stub.url,
        "GPU_HOTMOUNT_TOKEN_FILE": str(token),
        "GPU_HOTMOUNT_NAMESPACE": POD[0],
        "GPU_HOTMOUNT_POD": POD[1],
    }
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return Config.from_env(env)


@pytest.fixture
def shell() -> Iterator[object]:
    from IPython.core.interactiveshell import InteractiveShell

    made = InteractiveShell.instance()
    try:
        made.run_line_magic("load_ext", "cli.notebook")
        yield made
    finally:
        made.run_line_magic("unload_ext", "cli.notebook")
        InteractiveShell.clear_instance()


def cell(shell: object, capsys: pytest.CaptureFixture[str], code: str = "x = 1") -> str:
    """Run one cell; what it printed to stderr (where the warning goes)."""
    capsys.readouterr()
    result = shell.run_cell(code)  # type: ignore[attr-defined]
    assert result.success
    return capsys.readouterr().err


def status_calls(stub: StubAgent) -> int:
    return sum(1 for r in stub.received if r.path == STATUS_PATH)


def test_gpu_status_says_when_a_warned_gpu_is_reclaimed(stub: StubAgent, in_pod: Config) -> None:
    stub.warned[POD] = 239
    out, err = io.StringIO(), io.StringIO()
    assert notebook.magic("status", in_pod, out, err), err.getvalue()
    assert out.getvalue().strip() == (
        f"GPU 1 ({GPUS[1]['uuid']}) in main: idle 26m1s, given back after 30m idle; "
        "reclaimed in 4m unless used"
    )
    del stub.warned[POD]
    out = io.StringIO()
    assert notebook.magic("status", in_pod, out, err)
    assert "reclaimed" not in out.getvalue()


def test_under_the_policy_suspend_the_gpu_is_suspended_not_reclaimed(
    stub: StubAgent, in_pod: Config, shell: object, capsys: pytest.CaptureFixture[str]
) -> None:
    """The idle policy `suspend` takes the GPU and keeps the kernel: every message says
    `suspended`, and a suspended GPU says how it comes back."""
    stub.warned[POD] = 239
    stub.device_fields[POD] = {"idlePolicy": "suspend"}
    out, err = io.StringIO(), io.StringIO()
    assert notebook.magic("status", in_pod, out, err), err.getvalue()
    assert out.getvalue().strip() == (
        f"GPU 1 ({GPUS[1]['uuid']}) in main: idle 26m1s, suspended after 30m unused; "
        "suspended in 4m unless used"
    )
    assert cell(shell, capsys) == "%gpu: GPU 1 will be suspended in 4m unless used\n"

    del stub.warned[POD]
    stub.device_fields[POD] = {"state": "suspended", "paths": [], "idlePolicy": None}
    out = io.StringIO()
    assert notebook.magic("status", in_pod, out, err), err.getvalue()
    assert out.getvalue().strip() == (
        f"GPU 1 ({GPUS[1]['uuid']}) in main: suspended (its processes and their GPU memory "
        "kept in host memory); the next cell, or %gpu resume, gives a GPU back"
    )


def test_the_next_cell_prints_the_warning_once(
    stub: StubAgent, in_pod: Config, shell: object, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cell(shell, capsys) == ""  # nothing warned: nothing said
    assert status_calls(stub) == 1  # the hook asked after the cell

    stub.warned[POD] = 240
    assert cell(shell, capsys) == "%gpu: GPU 1 will be reclaimed in 4m unless used\n"
    stub.warned[POD] = 180  # the same warning, a minute on
    assert cell(shell, capsys) == ""
    assert cell(shell, capsys) == ""

    stub.warned[POD] = 1500  # used, the clock reset, warned again (a later reclaim)
    assert cell(shell, capsys) == "%gpu: GPU 1 will be reclaimed in 25m unless used\n"

    del stub.warned[POD]  # used again: no warning
    assert cell(shell, capsys) == ""
    stub.warned[POD] = 60  # a new warning, even with an earlier deadline, is said again
    assert cell(shell, capsys) == "%gpu: GPU 1 will be reclaimed in 1m unless used\n"
    assert cell(shell, capsys) == ""


def test_an_agent_that_cannot_answer_costs_one_quiet_call(
    stub: StubAgent, in_pod: Config, shell: object, capsys: pytest.CaptureFixture[str]
) -> None:
    stub.warned[POD] = 240
    stub.fail(503, "ServiceUnavailable", "agent restarting", path_contains=STATUS_PATH)
    assert notebook._warnings is not None
    notebook._warnings.backoff = 3600.0  # the next cells come within the backoff
    assert cell(shell, capsys) == ""  # no traceback, no message under the user's cell
    assert status_calls(stub) == 1
    stub.failures.clear()
    assert cell(shell, capsys) == ""
    assert status_calls(stub) == 1  # backing off: not asked again

    shell.run_line_magic("unload_ext", "cli.notebook")  # type: ignore[attr-defined]
    shell.run_line_magic("load_ext", "cli.notebook")  # type: ignore[attr-defined]
    assert "reclaimed in 4m unless used" in cell(shell, capsys)  # a fresh hook asks
    assert status_calls(stub) == 2


def test_outside_a_pod_the_hook_is_silent(
    shell: object, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("GPU_HOTMOUNT_NAMESPACE", "GPU_HOTMOUNT_AGENT", "GPU_HOTMOUNT_TOKEN_FILE"):
        monkeypatch.delenv(name, raising=False)
    assert not Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace").exists()
    assert cell(shell, capsys) == ""


def test_loading_the_extension_again_keeps_one_hook(
    stub: StubAgent, in_pod: Config, shell: object, capsys: pytest.CaptureFixture[str]
) -> None:
    notebook.load_ipython_extension(shell)  # as %reload_ext does, after the first load
    stub.warned[POD] = 240
    assert cell(shell, capsys).count("will be reclaimed") == 1
    assert status_calls(stub) == 1
