"""Shell completion: `nvcli completion bash|zsh`, answered by nvcli itself.

The bash case runs the printed script in a real bash and calls the function bash would
call on TAB; pods and GPUs come from the fake API server and its stub agent.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.cli.conftest import NVCLI, Cluster, Run
from tests.cli.stub_agent import GPUS

Nvcli = Callable[..., Run]

needs_bash = pytest.mark.skipif(shutil.which("bash") is None, reason="no bash")


def bash_complete(words: str, env: dict[str, str], executable: Path = NVCLI) -> list[str]:
    """What bash offers for `words` (the cursor at the end) once the script is sourced."""
    name = executable.name
    script = f"""
        source <({executable} completion bash)
        COMP_WORDS=({words}); COMP_CWORD=$(( ${{#COMP_WORDS[@]}} - 1 ))
        [[ "{words}" == *" " ]] && COMP_WORDS+=("") && COMP_CWORD=$(( COMP_CWORD + 1 ))
        _{name.replace("-", "_")}_completion {executable}
        printf '%s\\n' "${{COMPREPLY[@]}}"
    """
    path = f"{executable.parent}:{env.get('PATH', os.environ['PATH'])}"
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60,
                          env={**env, "PATH": path}, check=True)  # fmt: skip
    return [line for line in done.stdout.splitlines() if line]


@needs_bash
def test_bash_completes_commands_and_flags(clean_env: dict[str, str]) -> None:
    assert bash_complete("nvcli mo", clean_env) == ["mount", "move"]
    assert "--unmount" in bash_complete("nvcli unmount --", clean_env)


@needs_bash
def test_bash_completes_pods_of_the_namespace_and_gpus_from_the_agent(
    cluster: Cluster, clean_env: dict[str, str]
) -> None:
    for name in ("nb-0", "nb-1", "other"):
        cluster.apiserver.put_pod({"metadata": {"name": name, "namespace": "ml"}})
    cluster.apiserver.put_pod({"metadata": {"name": "nb-elsewhere", "namespace": "team-b"}})
    config = cluster.kubeconfig("alice", namespace="ml", token="alice-token")
    env = {**clean_env, "KUBECONFIG": str(config)}
    from tests.fakes import AccessRule

    cluster.apiserver.allow(AccessRule(group="ml-team", resource="pods", namespace="ml"))

    assert bash_complete("nvcli mount --name nb", env) == ["nb-0", "nb-1"]
    indices = bash_complete("nvcli mount --name nb-0 --mount ", env)
    assert indices == [str(g["index"]) for g in GPUS if g.get("index") is not None]


@needs_bash
def test_completion_that_cannot_reach_the_cluster_offers_nothing_and_prints_nothing(
    clean_env: dict[str, str], tmp_path: Path
) -> None:
    config = tmp_path / "config"
    config.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        "contexts: [{name: c, context: {cluster: k, user: u}}]\n"
        "clusters: [{name: k, cluster: {server: 'https://127.0.0.1:1'}}]\n"
        "users: [{name: u, user: {token: t}}]\n"
    )
    env = {**clean_env, "KUBECONFIG": str(config)}
    assert bash_complete("nvcli mount --name ", env) == []


def test_zsh_script_names_the_command_and_its_variable(nvcli: Nvcli) -> None:
    run = nvcli("completion", "zsh")
    assert run.rc == 0, run.err
    assert run.out.startswith("#compdef nvcli")
    assert "_NVCLI_COMPLETE=complete_zsh nvcli" in run.out


def test_zsh_protocol_answers_subcommands(nvcli: Nvcli) -> None:
    """What the zsh function asks, answered as zsh reads it (value:help pairs)."""
    run = nvcli(env={"_NVCLI_COMPLETE": "complete_zsh", "_TYPER_COMPLETE_ARGS": "nvcli mo"})
    assert run.rc == 0, run.err
    assert '"mount":"Hot-mount GPUs into a running pod."' in run.out
    assert '"move":' in run.out and '"status"' not in run.out


def test_an_unknown_shell_is_a_usage_error(nvcli: Nvcli) -> None:
    run = nvcli("completion", "tcsh")
    assert run.rc == 2
    assert "no completion for 'tcsh': use one of bash, zsh" in run.err
    assert run.out == ""


@needs_bash
def test_the_plugin_completes_as_kubectl_gpu(clean_env: dict[str, str], tmp_path: Path) -> None:
    plugin = tmp_path / "bin" / "kubectl-gpu"
    plugin.parent.mkdir()
    plugin.symlink_to(NVCLI.with_name("kubectl-gpu") if NVCLI.with_name("kubectl-gpu").exists()
                      else NVCLI)  # fmt: skip
    script = subprocess.run([str(plugin), "completion", "bash"], capture_output=True, text=True,
                            env=clean_env, check=True).stdout  # fmt: skip
    assert "complete -o default -F _kubectl_gpu_completion kubectl-gpu" in script
    assert bash_complete("kubectl-gpu unm", clean_env, plugin) == ["unmount"]
