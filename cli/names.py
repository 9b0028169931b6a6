"""nvcli's names: the program's (`nvcli`, or `kubectl gpu` as kubectl's plugin) and the
variable through which each one's shell completion asks for candidates. Its own cheap
module: cli/main.py needs them before it knows whether typer is needed at all."""

from __future__ import annotations

from pathlib import Path

# kubectl runs a plugin `kubectl gpu ARGS` as the executable `kubectl-gpu` on PATH, with
# ARGS as they were typed: kubectl's --kubeconfig, --context and -n among them.
PLUGIN_NAME = "kubectl gpu"


def program_name(argv0: str) -> str:
    """`kubectl gpu` when run as the kubectl plugin (its usage lines say so), else nvcli."""
    return PLUGIN_NAME if Path(argv0).name.startswith("kubectl-gpu") else "nvcli"


def complete_var(prog_name: str) -> str:
    """The variable the shell sets to ask for completions: `_NVCLI_COMPLETE` for nvcli,
    `_KUBECTL_GPU_COMPLETE` for the plugin (`kubectl gpu` or `kubectl-gpu`)."""
    return f"_{prog_name.replace('-', '_').replace(' ', '_').upper()}_COMPLETE"
