"""`%gpu suspend`, `%gpu resume` and the resume before the next cell (issue 33), in a real
IPython shell configured as inside the pod, against a real agent process with the
stand-in driver (tests/support/cuda_standin.py) and real runc containers. The stand-in
CUDA process keeps a known pattern in its "GPU memory": `pattern=ok` after a restore."""

from __future__ import annotations

import io
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from cli import notebook
from cli.notebook import Config
from tests.agent.conftest import ALICE
from tests.agent.test_idle_suspend import HUNG, IDLE, idle_notebook, idle_world
from tests.cli.test_notebook_warnings import cell
from tests.support.cuda_standin import MODEL, A, B, StandIn, status
from tests.support.suspend_world import (  # noqa: F401 (fixtures)
    World,
    gated_fixture,
    gates_fixture,
    standin_fixture,
)
from tests.support.waiting import wait_for

pytestmark = pytest.mark.kernel
PODS = "/v1/namespaces/default/pods"


def result(printed: str, progress: str) -> str:
    """The last line printed; every line before it a progress line (`progress` first:
    they come when a poll finds the operation running, which a fast one may not be)."""
    *before, last = printed.strip().splitlines()
    assert all(line.startswith(progress) for line in before), printed
    return last


@pytest.fixture
def world(tmp_path: Path, standin: StandIn, request: pytest.FixtureRequest) -> Iterator[World]:
    """The agent judges use by NVML (`idle`), or plain (NVML's GPUs not enumerated)."""
    idle = getattr(request, "param", None) == "idle"
    made = idle_world(tmp_path, standin) if idle else World(tmp_path, standin)
    try:
        yield made
    finally:
        made.close()


@pytest.fixture(name="in_pod")
def in_pod_fixture(world: World, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Config:
    """The environment `%gpu` reads inside pod default/nb (alice's token)."""
    token = tmp_path / "token"
    token.write_text(ALICE)
    env = {
        "GPU_HOTMOUNT_AGENT": world.agent.url,
        "GPU_HOTMOUNT_TOKEN_FILE": str(token),
        "GPU_HOTMOUNT_NAMESPACE": "default",
        "GPU_HOTMOUNT_POD": "nb",
    }
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return Config.from_env(env)


@pytest.fixture(name="shell")
def shell_fixture(in_pod: Config) -> Iterator[object]:
    from IPython.core.interactiveshell import InteractiveShell

    made = InteractiveShell.instance()
    try:
        made.run_line_magic("load_ext", "cli.notebook")
        yield made
    finally:
        made.run_line_magic("unload_ext", "cli.notebook")
        InteractiveShell.clear_instance()


@pytest.mark.parametrize("world", ["idle"], indirect=True)
def test_the_next_cell_resumes_after_an_idle_suspension(
    world: World, shell: object, capsys: pytest.CaptureFixture[str]
) -> None:
    container, _ = idle_notebook(world)
    # The look after this cell sees the policy `suspend`: the cells after it ask first.
    cell(shell, capsys, "tensors = [1, 2, 3]")

    wait_for(lambda: world.cluster.events("GPUSuspended"), "the idle suspension", timeout=HUNG)
    assert status(container) == "checkpointed - pattern=ok"

    said = cell(shell, capsys, "assert tensors == [1, 2, 3]")  # the kernel's state is kept
    # The idle world's timeout is seconds: the look after this cell may warn already.
    said = "\n".join(line for line in said.splitlines() if " will be suspended in " not in line)
    assert result(said, "%gpu: resume: ") == (
        f"%gpu: resumed {A}: 1 processes restored with their GPU memory"
    )
    assert status(container) == "running /dev/nvidia0 pattern=ok"


def test_gpu_suspend_and_resume_magics(
    world: World, shell: object, capsys: pytest.CaptureFixture[str]
) -> None:
    container, _ = world.notebook()
    capsys.readouterr()
    assert shell.run_cell("%gpu suspend").success  # type: ignore[attr-defined]
    said = capsys.readouterr()
    assert result(said.out, "suspend: ") == (
        f"suspended {A}: 1 processes kept, 512 MiB of GPU memory in host memory; "
        "the next cell (or %gpu resume) gives a GPU back"
    ), said.err
    assert status(container) == "checkpointed - pattern=ok"

    # A `%gpu` cell is not resumed first (the look after the last cell saw the
    # suspension): `%gpu resume` does it, and says so.
    assert shell.run_cell("%gpu resume").success  # type: ignore[attr-defined]
    said = capsys.readouterr()
    assert said.err == ""
    assert result(said.out, "resume: ") == (
        f"resumed {A}: 1 processes restored with their GPU memory"
    )
    assert status(container) == "running /dev/nvidia0 pattern=ok"


# With NVML on, each GPU is listed twice (NVML's and the CDI spec's name): a GPU held
# under one name is not free under the other.
@pytest.mark.parametrize("world", ["plain", "idle"], indirect=True)
def test_no_gpu_free_at_the_next_cell_runs_the_cell_without_one(
    world: World, shell: object, capsys: pytest.CaptureFixture[str]
) -> None:
    container, _ = world.notebook()
    world.cluster.pod("other")
    assert cell(shell, capsys, "%gpu suspend") == ""
    with world.agent.client(ALICE) as api:
        taken = api.post(f"{PODS}/other/devices", json={"devices": [A, B]})
    assert taken.status_code == 200, taken.text

    said = cell(shell, capsys, "ran = True")  # the cell runs (cell() asserts success)
    assert said == (
        f"%gpu: this pod's GPU is suspended and no GPU of model {MODEL} is free on this "
        "node: this cell runs without a GPU (a CUDA call waits until one is back); the "
        "next cell tries again\n"
    )
    assert shell.user_ns["ran"] is True  # type: ignore[attr-defined]
    assert status(container) == "checkpointed - pattern=ok"  # the suspension as it was

    if world.agent_args:  # NVML's names of the stand-in GPUs have no stand-in nodes
        return
    with world.agent.client(ALICE) as api:
        assert api.delete(f"{PODS}/other/devices/{B}").status_code == 200
    said = cell(shell, capsys)
    assert result(said, "%gpu: resume: ") == (
        f"%gpu: resumed {A} onto {B}: 1 processes restored with their GPU memory"
    )
    assert status(container) == "running /dev/nvidia1 pattern=ok"


def test_the_magics_are_listed_in_the_usage() -> None:
    assert notebook.parse("suspend").action == "suspend"
    assert notebook.parse("resume").action == "resume"
    assert "suspend | resume" in notebook.USAGE
    assert IDLE["idlePolicy"] == "suspend"


CHECKPOINTED = "suspend: checkpointed {}/2 processes, {} of 1.0 GiB moved to host memory"
RESTORED = "resume: restored {}/2 processes, {} of 1.0 GiB moved back to GPU memory"


def printed(out: io.StringIO, line: str) -> Callable[[], bool]:
    return lambda: line in out.getvalue().splitlines()


def test_gpu_suspend_and_resume_print_their_progress(
    gated: World, gates: Path, tmp_path: Path
) -> None:
    """Held at the stand-in driver's gates, `%gpu suspend` and `%gpu resume` have
    printed each count so far above the result they print when done."""
    container, pid = gated.notebook()
    first, second = gated.second_process(container, pid)
    token = tmp_path / "token"
    token.write_text(ALICE)
    config = Config(gated.agent.url, token, "default", "nb")
    for verb, gate, counted in (
        ("suspend", "checkpoint", CHECKPOINTED),
        ("resume", "restore", RESTORED),
    ):
        out, err = io.StringIO(), io.StringIO()
        with ThreadPoolExecutor(1) as pool:
            ran = pool.submit(notebook.magic, verb, config, out, err)
            wait_for(printed(out, counted.format(0, "0 MiB")), f"{verb}: 0/2", show=out.getvalue)
            (gates / f"{gate}-{first}").touch()
            wait_for(printed(out, counted.format(1, "512 MiB")), f"{verb}: 1/2", show=out.getvalue)
            (gates / f"{gate}-{second}").touch()
            assert ran.result(timeout=60), err.getvalue()
        last = result(out.getvalue(), f"{verb}: ")
        assert last.startswith(f"suspended {A}" if verb == "suspend" else f"resumed {A}")
    assert status(container) == "running /dev/nvidia0 pattern=ok"
