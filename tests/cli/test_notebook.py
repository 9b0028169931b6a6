"""`%gpu` (cli/notebook/) without an agent: parsing, configuration, CUDA checks, messages, and
the extension loaded into a real IPython shell."""

from __future__ import annotations

import io
from pathlib import Path
from types import SimpleNamespace

import pytest

from cli import notebook
from cli.notebook import Command, Config, NotebookError, parse
from hotmount.wire.errors import error_for, make_status
from hotmount.wire.schemas import MountedDevice, MountResult, UnmountResult


@pytest.mark.parametrize(
    ("line", "command"),
    [
        ("attach", Command("attach", count=1)),
        ("attach 0 1", Command("attach", devices=["0", "1"])),
        ("attach --count 2", Command("attach", count=2)),
        ("attach --count=2 --idle 30m", Command("attach", count=2, idle_timeout="30m")),
        ("attach GPU-aaaa --idle=1h", Command("attach", devices=["GPU-aaaa"], idle_timeout="1h")),
        ("attach 0 --once", Command("attach", devices=["0"], once=True)),
        ("detach", Command("detach", all=True)),
        ("detach 0", Command("detach", devices=["0"])),
        ("detach --all", Command("detach", all=True)),
        ("status", Command("status")),
        ("list", Command("list")),
        ("", Command("help")),
        ("help", Command("help")),
    ],
)
def test_parse(line: str, command: Command) -> None:
    assert parse(line) == command


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("attach 0 --count 2", "name GPUs or give --count, not both"),
        ("attach --count two", "--count takes a number of GPUs (1, 2, ...), not 'two'"),
        ("attach --count 0", "--count takes a number of GPUs"),
        ("attach --count", "--count needs a value"),
        ("attach --force", "attach has no option --force"),
        ("detach --all 0", "name GPUs or give --all, not both"),
        ("detach --count 1", "detach has no option --count"),
        ("status 0", "status takes no arguments"),
        ("mount 0", "unknown command 'mount'"),
        ("attach '0", "No closing quotation"),
    ],
)
def test_bad_lines_say_what_is_wrong_and_how_to_say_it(line: str, message: str) -> None:
    with pytest.raises(NotebookError) as caught:
        parse(line)
    assert message in str(caught.value)
    assert "\n" not in str(caught.value)


def service_account(tmp_path: Path, namespace: str = "team-a") -> Path:
    directory = tmp_path / "sa"
    directory.mkdir()
    (directory / "token").write_text("the-token\n")
    (directory / "namespace").write_text(namespace)
    (directory / "ca.crt").write_text("cluster ca")
    return directory


def test_zero_config_inside_a_pod(tmp_path: Path) -> None:
    sa = service_account(tmp_path)
    config = Config.from_env({"HOSTNAME": "jupyter-alice"}, sa)
    assert config == Config(
        agent="https://gpu-hotmount.gpu-hotmount.svc",
        token_file=sa / "token",
        namespace="team-a",
        pod="jupyter-alice",
        ca_file=sa / "ca.crt",
    )
    assert config.token() == "the-token"


def test_every_guess_can_be_overridden(tmp_path: Path) -> None:
    sa = service_account(tmp_path)
    (tmp_path / "other-token").write_text("other")
    env = {
        "HOSTNAME": "jupyter-alice",
        "GPU_HOTMOUNT_AGENT": "https://agent.example:8443/",
        "GPU_HOTMOUNT_TOKEN_FILE": str(tmp_path / "other-token"),
        "GPU_HOTMOUNT_NAMESPACE": "ml",
        "GPU_HOTMOUNT_POD": "nb-0",
        "GPU_HOTMOUNT_CONTAINER": "notebook",
        "GPU_HOTMOUNT_CA_FILE": "/etc/hotmount/ca.crt",
        "GPU_HOTMOUNT_IDLE_TIMEOUT": "30m",
    }
    config = Config.from_env(env, sa)
    assert config == Config(
        agent="https://agent.example:8443",
        token_file=tmp_path / "other-token",
        namespace="ml",
        pod="nb-0",
        container="notebook",
        ca_file=Path("/etc/hotmount/ca.crt"),
        idle_timeout="30m",
    )
    assert config.token() == "other"


def test_outside_a_pod_the_error_says_what_to_set(tmp_path: Path) -> None:
    with pytest.raises(NotebookError, match="set GPU_HOTMOUNT_NAMESPACE"):
        Config.from_env({}, tmp_path / "nothing")
    config = Config.from_env({"GPU_HOTMOUNT_NAMESPACE": "ml"}, tmp_path / "nothing")
    with pytest.raises(NotebookError, match="no ServiceAccount token at"):
        config.token()


@pytest.mark.parametrize(
    "agent",
    ["http://gpu-hotmount.gpu-hotmount.svc", "http://10.0.0.7:8080", "http://[::ffff:10.0.0.7]"],
)
def test_the_token_never_goes_to_an_agent_over_plain_http(tmp_path: Path, agent: str) -> None:
    env = {"HOSTNAME": "jupyter-alice", "GPU_HOTMOUNT_AGENT": agent}
    with pytest.raises(NotebookError, match="clear text") as refused:
        Config.from_env(env, service_account(tmp_path))
    assert "\n" not in str(refused.value) and "GPU_HOTMOUNT_AGENT" in str(refused.value)


@pytest.mark.parametrize("agent", ["http://gpu-hotmount-local.gpu-hotmount.svc", "http://10.0.0.7"])
def test_a_config_built_by_hand_refuses_plain_http_too(tmp_path: Path, agent: str) -> None:
    """`Config(...)` without from_env: the same refusal, before any token is read."""
    with pytest.raises(NotebookError, match="clear text"):
        Config(agent=agent, token_file=tmp_path / "token", namespace="ml", pod="nb-0")
    https = Config(agent="https://10.0.0.7", token_file=tmp_path / "t", namespace="ml", pod="p")
    assert https.agent == "https://10.0.0.7"


@pytest.mark.parametrize(
    "agent", ["http://127.0.0.1:8080", "http://localhost:9", "http://[::1]:80"]
)
def test_plain_http_to_this_machine_is_allowed(tmp_path: Path, agent: str) -> None:
    env = {"HOSTNAME": "jupyter-alice", "GPU_HOTMOUNT_AGENT": agent}
    assert Config.from_env(env, service_account(tmp_path)).agent == agent


def torch_like(initialised: bool) -> SimpleNamespace:
    return SimpleNamespace(cuda=SimpleNamespace(is_initialized=lambda: initialised))


def test_cuda_already_initialised_is_noticed() -> None:
    assert notebook.cuda_initialised({"torch": torch_like(True)}) == ["torch"]
    jax = SimpleNamespace(_backends={"cuda": object(), "cpu": object()})
    assert notebook.cuda_initialised({"jax._src.xla_bridge": jax}) == ["jax"]


def test_imported_but_unused_cuda_is_not_initialised() -> None:
    modules = {
        "torch": torch_like(False),
        "jax._src.xla_bridge": SimpleNamespace(_backends={}),
        "weird": SimpleNamespace(),
    }
    assert notebook.cuda_initialised(modules) == []
    broken = {"torch": SimpleNamespace()}  # another version's layout: no answer, no error
    assert notebook.cuda_initialised(broken) == []


CONFIG = Config("https://agent", Path("/t"), "team-a", "jupyter-alice")
GPU = MountedDevice(key="GPU-aaaa", kind="gpu", index=0, paths=["/dev/nvidia0"], idle_timeout="30m")


def test_attach_message_tells_to_restart_the_kernel_when_cuda_ran_already() -> None:
    result = MountResult(container="notebook", container_id="c", mounted=[GPU], already_mounted=[])
    fresh = notebook.attached_message(result, [], CONFIG)
    assert fresh == (
        "attached GPU 0 (GPU-aaaa) to team-a/jupyter-alice (notebook); given back after 30m "
        "unused. Use it from this kernel: CUDA finds it on first use."
    )
    stale = notebook.attached_message(result, ["torch"], CONFIG)
    assert "initialised CUDA before (torch)" in stale and "restart the kernel" in stale


def test_detach_messages() -> None:
    none = UnmountResult(container_id="c", unmounted=[], not_mounted=[], stopped_pids=[])
    assert "nothing to detach" in notebook.detached_message(none)
    done = UnmountResult(
        container_id="c",
        unmounted=["GPU-aaaa"],
        not_mounted=[],
        stopped_pids=[],
        holder_pods_deleted=["hotmount-holder-x"],
    )
    assert notebook.detached_message(done) == ("detached GPU-aaaa (its scheduler slot is released)")


@pytest.mark.parametrize(
    ("code", "reason", "details", "action", "expected"),
    [
        (403, "Forbidden", {}, "attach", "no permission: this pod's ServiceAccount may not"),
        (403, "Forbidden", {}, "list", "takes the hotmount-viewer ClusterRole"),
        (401, "Unauthorized", {}, "attach", "did not accept this pod's ServiceAccount token"),
        (409, "Unschedulable", {}, "attach", "no free GPU on this node right now"),
        (409, "DeviceClaimed", {}, "attach", "that GPU is in use elsewhere"),
        (409, "AllocatedToPod", {}, "attach", "that GPU is in use elsewhere"),
        (
            409,
            "DeviceBusy",
            {"holders": [{"pid": 42, "command": "python"}]},
            "detach",
            "in use in this pod by PID 42 (python)",
        ),
        (503, "Unavailable", {}, "status", "cannot reach the gpu-hotmount agent"),
    ],
)
def test_errors_are_one_line_a_notebook_user_understands(
    code: int, reason: str, details: dict, action: str, expected: str
) -> None:
    exc = error_for(make_status(code, "the agent's words", reason, **details))
    message = notebook.error_message(exc, CONFIG, action)
    assert expected in message and "\n" not in message


def test_the_magic_prints_one_line_and_no_traceback() -> None:
    out, err = io.StringIO(), io.StringIO()
    assert notebook.magic("attach --count x", CONFIG, out, err) is False
    assert out.getvalue() == ""
    assert err.getvalue().count("\n") == 1 and "Traceback" not in err.getvalue()
    assert err.getvalue().startswith("%gpu: --count takes a number")


def test_the_extension_loads_into_ipython(capsys: pytest.CaptureFixture[str]) -> None:
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    try:
        shell.run_line_magic("load_ext", "cli.notebook")
        shell.run_line_magic("gpu", "help")
        shell.run_line_magic("gpu", "frobnicate")
    finally:
        InteractiveShell.clear_instance()
    captured = capsys.readouterr()
    assert captured.out.startswith("usage: %gpu attach")
    assert captured.err.strip().startswith("%gpu: unknown command 'frobnicate'")
    assert "Traceback" not in captured.err
