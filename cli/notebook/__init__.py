"""`%gpu`: attach and detach GPUs from inside a notebook (an IPython extension).

    %load_ext cli.notebook
    %gpu attach                 one GPU the scheduler counts (a holder pod takes it)
    %gpu attach --count 2       two of them
    %gpu attach 0               GPU 0 of this node (by index, UUID or CDI name)
    %gpu attach --idle 30m      ... given back once nothing has used it for 30 minutes
    %gpu detach 0               give GPU 0 back; `%gpu detach` or `--all`: every one
    %gpu status                 what this pod has, and how long each GPU has been idle
    %gpu list                   the GPUs free on the node
    %gpu suspend                take the GPUs away, the kernel and its GPU memory kept
    %gpu resume                 a GPU back, the kernel's GPU memory restored onto it

After each cell the extension asks the agent (2s at most, silent on error) whether a GPU
of this pod was warned before an idle reclaim, and prints it once per warning:
`%gpu: GPU 0 will be reclaimed in 4m unless used`. Before each cell, a suspended GPU of
this pod (`%gpu suspend`, or the idle policy `suspend`) is resumed first
(cli/notebook/suspend.py). With GPU_HOTMOUNT_ON_DEMAND=1 (a pod annotated
hotmount.io/gpu-on-demand) the pod holds a GPU only while its cells run: each cell asks
for it first, waiting in line when none is free (cli/notebook/ondemand.py).

The same as Python calls, for platforms: `attach()`, `detach()`, `status()`,
`list_gpus()` return the agent's models; `run(line)` returns the magic's message.

Inside the notebook's pod nothing needs configuring; each guess can be overridden:

    GPU_HOTMOUNT_AGENT       https://gpu-hotmount.gpu-hotmount.svc (the agents' Service)
    GPU_HOTMOUNT_TOKEN_FILE  /var/run/secrets/kubernetes.io/serviceaccount/token
    GPU_HOTMOUNT_NAMESPACE   .../serviceaccount/namespace
    GPU_HOTMOUNT_POD         $HOSTNAME (a pod's hostname is its name)
    GPU_HOTMOUNT_CONTAINER   the pod's first container
    GPU_HOTMOUNT_CA_FILE     /var/run/secrets/hotmount.io/ca.crt if mounted, else the
                             ServiceAccount's ca.crt (the agent's CA verifies the Service)
    GPU_HOTMOUNT_IDLE_TIMEOUT  idle timeout of every attach (`--idle` wins)

In a pod started without the NVIDIA runtime, the agent (its --inject-driver, auto by
default) brings the driver's libraries and tools with the GPU; what they need in the
environment (LD_LIBRARY_PATH, when the image's own linker cache would hide them) is
set in this kernel's `os.environ`, so its subprocesses (`!nvidia-smi`) get it.

A process that initialised CUDA before the attach does not see the new GPU (the
driver enumerates devices once, at cuInit): the magic says so, and to restart the
kernel, when it finds CUDA already initialised in this kernel.

This module only wires the extension (the magic and the two cell hooks) and keeps the
names platforms and docs import; each part lives apart: cli/notebook/config.py (the
pod's configuration), cli/notebook/calls.py (the calls, the CUDA check),
cli/notebook/messages.py (what the user reads), cli/notebook/magic.py (parsing and
running a `%gpu` line), cli/notebook/warnings.py (the warning after a cell),
cli/notebook/suspend.py (suspend, resume, the resume before a cell),
cli/notebook/ondemand.py (a GPU only while cells run).
"""

from __future__ import annotations

from typing import Any

from cli.notebook.calls import (
    PATH_LISTS,
    attach,
    cuda_initialised,
    detach,
    environment_after,
    list_gpus,
    status,
)
from cli.notebook.config import (
    AGENT_CA,
    DEFAULT_AGENT,
    SERVICE_ACCOUNT,
    Config,
    NotebookError,
)
from cli.notebook.magic import USAGE, Command, magic, parse, run
from cli.notebook.messages import (
    attached_message,
    detached_message,
    error_message,
    list_message,
    status_message,
)
from cli.notebook.warnings import ReclaimWarnings

__all__ = [
    "AGENT_CA",
    "DEFAULT_AGENT",
    "PATH_LISTS",
    "SERVICE_ACCOUNT",
    "USAGE",
    "Command",
    "Config",
    "NotebookError",
    "ReclaimWarnings",
    "attach",
    "attached_message",
    "cuda_initialised",
    "detach",
    "detached_message",
    "environment_after",
    "error_message",
    "list_gpus",
    "list_message",
    "load_ipython_extension",
    "magic",
    "parse",
    "run",
    "status",
    "status_message",
    "unload_ipython_extension",
]


def load_ipython_extension(ipython: Any) -> None:
    """`%load_ext cli.notebook`: the `%gpu` magic, the reclaim warning after each cell,
    and the resume of a suspended GPU before each cell."""

    def gpu(line: str) -> None:
        magic(line)

    gpu.__doc__ = __doc__
    ipython.register_magic_function(gpu, magic_kind="line", magic_name="gpu")
    global _warnings
    if _warnings is not None:  # %reload_ext: one hook, not two
        _unregister(ipython, _warnings)
    _warnings = ReclaimWarnings()
    ipython.events.register("post_run_cell", _warnings)
    global _resumes, _on_demand
    if _resumes is not None:
        _unregister(ipython, _resumes, "pre_run_cell")
        _resumes = None
    if _on_demand is not None:
        _unregister(ipython, _on_demand.before, "pre_run_cell")
        _unregister(ipython, _on_demand.after)
        _on_demand = None
    from cli.notebook import ondemand

    if ondemand.enabled():  # the acquire before each cell resumes a suspended GPU too
        _on_demand = ondemand.OnDemandCells(
            config_of=Config.from_env,
            explain=lambda exc, config: error_message(exc, config, "acquire"),
        )
        ipython.events.register("pre_run_cell", _on_demand.before)
        ipython.events.register("post_run_cell", _on_demand.after)
        return
    from cli.notebook.suspend import AutoResume

    watch = _warnings
    _resumes = AutoResume(
        config_of=Config.from_env,
        explain=lambda exc, config: error_message(exc, config, "resume"),
        watching=lambda: watch.suspendable,
    )
    ipython.events.register("pre_run_cell", _resumes)


def unload_ipython_extension(ipython: Any) -> None:
    global _warnings, _resumes, _on_demand
    if _warnings is not None:
        _unregister(ipython, _warnings)
        _warnings = None
    if _resumes is not None:
        _unregister(ipython, _resumes, "pre_run_cell")
        _resumes = None
    if _on_demand is not None:
        _unregister(ipython, _on_demand.before, "pre_run_cell")
        _unregister(ipython, _on_demand.after)
        _on_demand = None


def _unregister(ipython: Any, hook: Any, event: str = "post_run_cell") -> None:
    import contextlib

    with contextlib.suppress(ValueError):  # registered with another shell
        ipython.events.unregister(event, hook)


_warnings: ReclaimWarnings | None = None
_resumes: Any = None  # the AutoResume registered, if any
_on_demand: Any = None  # the OnDemandCells registered, if any (GPU_HOTMOUNT_ON_DEMAND)
