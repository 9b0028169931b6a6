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
(cli/notebook_suspend.py).

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
"""

from __future__ import annotations

import os
import shlex
import socket
import sys
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the client (pydantic) loads on the first call, not at %load_ext
    from agent.schemas import DeviceList, MountResult, PodDevices, UnmountResult
    from cli.client import HotmountClient

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
AGENT_CA = Path("/var/run/secrets/hotmount.io/ca.crt")
DEFAULT_AGENT = "https://gpu-hotmount.gpu-hotmount.svc"
USAGE = (
    "usage: %gpu attach [N ... | --count N] [--idle 30m] [--once] | detach [N ... | --all]"
    " | status | list | suspend | resume"
)


class NotebookError(Exception):
    """A problem the user can fix, said in one line."""


# -- configuration ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Config:
    """Where the agent is and who this pod is; `token_file` is read at every call
    (projected ServiceAccount tokens are rotated)."""

    agent: str
    token_file: Path
    namespace: str
    pod: str
    container: str | None = None
    ca_file: Path | None = None
    idle_timeout: str | None = None

    @classmethod
    def from_env(
        cls, env: Mapping[str, str] | None = None, service_account: Path = SERVICE_ACCOUNT
    ) -> Config:
        env = os.environ if env is None else env
        token_file = Path(env.get("GPU_HOTMOUNT_TOKEN_FILE") or service_account / "token")
        namespace = env.get("GPU_HOTMOUNT_NAMESPACE") or _read(service_account / "namespace")
        if not namespace:
            raise NotebookError(
                f"cannot tell this pod's namespace: no {service_account}/namespace "
                "(not inside a Kubernetes pod?); set GPU_HOTMOUNT_NAMESPACE"
            )
        pod = env.get("GPU_HOTMOUNT_POD") or env.get("HOSTNAME") or socket.gethostname()
        ca = env.get("GPU_HOTMOUNT_CA_FILE")
        ca_file = Path(ca) if ca else _first_file(AGENT_CA, service_account / "ca.crt")
        from cli.cleartext import refuse_plain_credentials

        agent = (env.get("GPU_HOTMOUNT_AGENT") or DEFAULT_AGENT).rstrip("/")
        try:  # the pod's token goes with every call: never in clear text on the network
            refuse_plain_credentials(agent, "this pod's ServiceAccount token")
        except ValueError as exc:
            raise NotebookError(f"GPU_HOTMOUNT_AGENT: {exc}") from None
        return cls(
            agent=agent,
            token_file=token_file,
            namespace=namespace,
            pod=pod,
            container=env.get("GPU_HOTMOUNT_CONTAINER") or None,
            ca_file=ca_file,
            idle_timeout=env.get("GPU_HOTMOUNT_IDLE_TIMEOUT") or None,
        )

    def __post_init__(self) -> None:
        """Built by hand too: the pod's token goes with every call, never in clear text."""
        from cli.cleartext import refuse_plain_credentials

        try:
            refuse_plain_credentials(self.agent, "this pod's ServiceAccount token")
        except ValueError as exc:
            raise NotebookError(str(exc)) from None

    def token(self) -> str:
        token = _read(self.token_file)
        if not token:
            raise NotebookError(
                f"no ServiceAccount token at {self.token_file} (the pod has "
                "automountServiceAccountToken: false?); set GPU_HOTMOUNT_TOKEN_FILE"
            )
        return token

    def client(self) -> HotmountClient:
        from cli.client import HotmountClient

        verify: str | bool = str(self.ca_file) if self.ca_file else True
        return HotmountClient.for_agent(self.agent, self.token(), verify=verify)


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def _first_file(*paths: Path) -> Path | None:
    return next((p for p in paths if p.is_file()), None)


# -- parsing ---------------------------------------------------------------------------------


@dataclass
class Command:
    action: str  # attach | detach | status | list | suspend | resume | help
    devices: list[str] = field(default_factory=list)
    count: int | None = None
    all: bool = False
    idle_timeout: str | None = None
    once: bool = False  # not mounted again if the notebook's container restarts


def parse(line: str) -> Command:
    """`attach 0 1`, `attach --count 2 --idle 30m`, `detach --all`, `status`, `list`."""
    try:
        words = shlex.split(line)
    except ValueError as exc:
        raise NotebookError(f"{exc}; {USAGE}") from exc
    if not words or words[0] in ("help", "-h", "--help"):
        return Command("help")
    action, rest = words[0], words[1:]
    if action not in ("attach", "detach", "status", "list", "suspend", "resume"):
        raise NotebookError(f"unknown command {action!r}; {USAGE}")
    command = Command(action)
    while rest:
        word = rest.pop(0)
        option, _, value = word.partition("=")
        if action == "attach" and option in ("--count", "-n", "--idle"):
            if not value:
                if not rest:
                    raise NotebookError(f"{option} needs a value; {USAGE}")
                value = rest.pop(0)
            if option == "--idle":
                command.idle_timeout = value
            elif not value.isdigit() or int(value) < 1:
                raise NotebookError(f"--count takes a number of GPUs (1, 2, ...), not {value!r}")
            else:
                command.count = int(value)
        elif action == "detach" and word == "--all":
            command.all = True
        elif action == "attach" and word == "--once":
            command.once = True
        elif word.startswith("-"):
            raise NotebookError(f"{action} has no option {word}; {USAGE}")
        elif action in ("attach", "detach"):
            command.devices.append(word)
        else:
            raise NotebookError(f"{action} takes no arguments; {USAGE}")
    if command.devices and command.count is not None:
        raise NotebookError("name GPUs or give --count, not both")
    if command.devices and command.all:
        raise NotebookError("name GPUs or give --all, not both")
    if action == "attach" and not command.devices and command.count is None:
        command.count = 1
    if action == "detach" and not command.devices:
        command.all = True
    return command


# -- CUDA ------------------------------------------------------------------------------------


def cuda_initialised(modules: Mapping[str, Any] | None = None) -> list[str]:
    """The libraries in this process that have already initialised CUDA. Cheap checks that
    initialise nothing: torch's and jax's own flags when they are imported, then the CUDA
    driver library among the process's mappings (cupy, numba, TensorFlow load it at
    their first CUDA call)."""
    modules = sys.modules if modules is None else modules
    found = []
    torch = modules.get("torch")
    if torch is not None and _quietly(_torch_initialised, torch):
        found.append("torch")
    bridge = modules.get("jax._src.xla_bridge")
    if bridge is not None and _quietly(_jax_initialised, bridge):
        found.append("jax")
    if not found and _libcuda_loaded():
        found.append("the CUDA driver (libcuda)")
    return found


def _torch_initialised(torch: Any) -> bool:
    return bool(torch.cuda.is_initialized())


def _jax_initialised(bridge: Any) -> bool:
    return "cuda" in (bridge._backends or {})  # filled at jax's first device use


def _quietly(check: Any, module: Any) -> bool:
    """A library's own answer; False where it has none (another version's layout)."""
    try:
        return bool(check(module))
    except Exception:
        return False


def _libcuda_loaded(maps: Path = Path("/proc/self/maps")) -> bool:
    try:
        return "/libcuda.so" in maps.read_text()
    except OSError:
        return False


# -- the calls platforms import --------------------------------------------------------------


def attach(
    devices: list[str] | None = None,
    count: int | None = None,
    idle_timeout: str | None = None,
    config: Config | None = None,
    once: bool = False,
    environ: MutableMapping[str, str] | None = None,
) -> MountResult:
    """Hot-mount GPUs into this pod: `devices` by name, else `count` (default 1). They
    come back if the container restarts, unless `once`. withDriver is left to the node
    (auto: the driver's files come when this image has no libcuda.so.1); the environment
    they need goes into `environ` (default `os.environ`: this kernel's subprocesses)."""
    from pydantic import ValidationError

    from agent.schemas import MountRequest
    from cli.errors import InvalidRequest, make_status

    config = config or Config.from_env()
    try:
        request = MountRequest(
            devices=devices or None,
            count=None if devices else (count or 1),
            container=config.container,
            idle_timeout=idle_timeout or config.idle_timeout,
            once=once or None,
        )
    except ValidationError as exc:
        problems = "; ".join(str(e["msg"]).removeprefix("Value error, ") for e in exc.errors())
        raise InvalidRequest(make_status(400, problems, "BadRequest")) from exc
    with config.client() as client:
        result = client.transport.mount(config.namespace, config.pod, request)
    if result.driver is not None:
        target = os.environ if environ is None else environ
        target.update(environment_after(result.driver.env, target))
    return result


PATH_LISTS = ("LD_LIBRARY_PATH", "PATH")  # the new entries go first; the old ones stay


def environment_after(edits: Mapping[str, str], current: Mapping[str, str]) -> dict[str, str]:
    """The variables to set: `edits`, with a search path put before the one already set."""
    out = {}
    for name, value in edits.items():
        old = current.get(name, "")
        kept = [p for p in old.split(":") if p and p not in value.split(":")]
        out[name] = ":".join([value, *kept]) if name in PATH_LISTS and kept else value
    return out


def detach(devices: list[str] | None = None, config: Config | None = None) -> UnmountResult:
    """Give GPUs back (every hot-mounted one when `devices` is None)."""
    config = config or Config.from_env()
    with config.client() as client:
        return client.unmount(config.namespace, config.pod, devices or None, config.container)


def status(config: Config | None = None) -> PodDevices:
    """What is hot-mounted into this pod, with each GPU's idle timeout and idle time."""
    config = config or Config.from_env()
    with config.client() as client:
        return client.status(config.namespace, config.pod)


def list_gpus(config: Config | None = None) -> list[DeviceList]:
    """Every node's GPUs the caller may see and who holds each (needs `list` on
    `nodedevices`): this node's agent asks the others; nodes that did not answer last."""
    config = config or Config.from_env()
    with config.client() as client:
        return client.list_every_node()


# -- messages --------------------------------------------------------------------------------


def _gpu(key: str, index: int | None) -> str:
    return f"GPU {index} ({key})" if index is not None else key


def attached_message(result: MountResult, cuda: list[str], config: Config) -> str:
    where = f"{config.namespace}/{config.pod}" + (
        f" ({result.container})" if result.container else ""
    )
    if not result.mounted:
        names = ", ".join(_gpu(d.key, d.index) for d in result.already_mounted)
        return f"{names} already attached to {where}"
    names = ", ".join(_gpu(d.key, d.index) for d in result.mounted)
    text = f"attached {names} to {where}"
    idle = result.mounted[0].idle_timeout
    if idle:
        text += f"; given back after {idle} unused"
    if result.driver is not None:
        text += f"; with the driver's files ({len(result.driver.files)})"
        if result.driver.env:
            text += f", and {', '.join(sorted(result.driver.env))} set for subprocesses"
    if cuda:
        return (
            f"{text}. This kernel initialised CUDA before ({', '.join(cuda)}), so it cannot "
            "see the new GPU: restart the kernel, then use it."
        )
    return f"{text}. Use it from this kernel: CUDA finds it on first use."


def detached_message(result: UnmountResult) -> str:
    if not result.unmounted:
        return "nothing to detach: no GPU is hot-mounted into this pod"
    text = f"detached {', '.join(result.unmounted)}"
    if result.holder_pods_deleted:
        text += " (its scheduler slot is released)"
    return text


def status_message(result: PodDevices, config: Config) -> str:
    lines = [
        f"{_gpu(d.key, d.index)} in {c.container or c.container_id[:12]}: {_idle_text(d)}"
        for c in result.containers
        for d in c.devices
    ]
    return "\n".join(lines) or f"no GPU is hot-mounted into {config.namespace}/{config.pod}"


def _idle_text(device: Any) -> str:
    from agent.idle import format_duration

    if device.state == "suspended":
        return (
            "suspended (its processes and their GPU memory kept in host memory); "
            "the next cell, or %gpu resume, gives a GPU back"
        )
    suspends = device.idle_policy == "suspend"  # the GPU goes idle, the kernel stays
    if device.idle_seconds is None:
        idle = "idle time not measured yet"
    elif device.idle_seconds == 0:
        idle = "in use"
    else:
        idle = f"idle {format_duration(device.idle_seconds)}"
    timeout = device.idle_timeout
    after = f"suspended after {timeout} unused" if suspends else f"given back after {timeout} idle"
    text = f"{idle}, " + (after if timeout else "kept until detached")
    if device.reclaim_in_seconds is not None:  # warned (GPUIdleSoon)
        from cli.output import reclaim_text

        text += f"; {reclaim_text(device.reclaim_in_seconds, device.idle_policy)}"
    if device.idle_policy_note:
        text += f" ({device.idle_policy_note})"
    return text


def list_message(listings: list[DeviceList]) -> str:
    """One line per node: its free GPUs, or why it is not listed."""
    lines = []
    for listing in listings:
        node = listing.node or "this node"
        unavailable = getattr(listing, "unavailable", None)
        if unavailable is not None:
            lines.append(f"{node}: did not answer ({unavailable.reason})")
            continue
        free = [d for d in listing.devices if not d.holders and d.kind != "rdma"]
        if not free:
            lines.append(f"no free GPU on {node}")
        else:
            lines.append(f"free on {node}: " + ", ".join(_gpu(d.key, d.index) for d in free))
    return "\n".join(lines) or "no node listed"


def error_message(exc: BaseException, config: Config | None = None, action: str = "") -> str:
    """One line a notebook user understands; never a traceback."""
    if isinstance(exc, NotebookError):
        return str(exc)
    from cli.errors import (
        Busy,
        Conflict,
        Forbidden,
        HotmountClientError,
        Timeout,
        Unauthorized,
        Unavailable,
    )

    if not isinstance(exc, HotmountClientError):
        return f"gpu-hotmount: {exc}"
    pod = f"{config.namespace}/{config.pod}" if config else "this pod"
    reason = exc.reason
    if isinstance(exc, Forbidden):
        if action == "list":
            return (
                "no permission to list the node's GPUs: that takes the hotmount-viewer "
                "ClusterRole (ask your platform admin); attach needs no listing"
            )
        return (
            f"no permission: this pod's ServiceAccount may not attach GPUs to {pod}; "
            "ask for a RoleBinding to hotmount-user in this namespace (docs/notebooks.md)"
        )
    if isinstance(exc, Unauthorized):
        return "the gpu-hotmount agent did not accept this pod's ServiceAccount token"
    if isinstance(exc, Busy):
        held = ", ".join(f"PID {h.get('pid')} ({h.get('command')})" for h in exc.holders)
        return f"the GPU is in use in this pod by {held}: stop it, or restart the kernel, first"
    if reason == "Unschedulable":
        return f"no free GPU on this node right now ({exc.message})"
    if reason in ("DeviceClaimed", "AllocatedToPod"):
        return f"that GPU is in use elsewhere: {exc.message}"
    if isinstance(exc, Conflict):
        return f"cannot do that now: {exc.message}"
    if isinstance(exc, Timeout):
        return f"the agent took too long: {exc.message}"
    if isinstance(exc, Unavailable):
        return f"cannot reach the gpu-hotmount agent: {exc.message}"
    return exc.message


# -- the magic -------------------------------------------------------------------------------


def run(line: str, config: Config | None = None) -> str:
    """Do what `%gpu <line>` asks; returns the message (errors raise, see `magic`)."""
    command = parse(line)
    if command.action == "help":
        return USAGE
    config = config or Config.from_env()
    if command.action == "attach":
        result = attach(
            command.devices, command.count, command.idle_timeout, config, once=command.once
        )
        return attached_message(result, cuda_initialised(), config)
    if command.action == "detach":
        return detached_message(detach(None if command.all else command.devices, config))
    if command.action == "status":
        return status_message(status(config), config)
    if command.action in ("suspend", "resume"):
        from cli import notebook_suspend as ns

        if command.action == "suspend":
            return ns.suspended_message(ns.suspend(config))
        return ns.resumed_message(ns.resume(config))
    return list_message(list_gpus(config))


def magic(line: str, config: Config | None = None, stdout: Any = None, stderr: Any = None) -> bool:
    """`%gpu`: prints the message, or one line to stderr on any failure. True if it worked."""
    out, err = stdout or sys.stdout, stderr or sys.stderr
    action = (line.split(maxsplit=1) or [""])[0]
    try:
        print(run(line, config), file=out)
    except Exception as exc:
        try:
            text = error_message(exc, config, action)
        except Exception:  # even a broken install gets its one line, not a traceback
            text = f"gpu-hotmount: {exc}"
        print(f"%gpu: {text}", file=err)
        return False
    return True


# -- the reclaim warning after a cell ---------------------------------------------------------


@dataclass
class ReclaimWarnings:
    """Says once per warning, after the next cell, that a GPU of this pod will be reclaimed.

    The agent warns (`GPUIdleSoon`) before an idle GPU is reclaimed; a notebook user
    reads neither Events nor `nvcli status`. IPython's `post_run_cell` calls this after
    every cell, in the kernel's own thread (no background thread): it asks the agent for
    this pod's status with a short timeout and prints nothing on any error. After an
    error it stays quiet for `backoff` seconds, so a kernel whose agent is unreachable
    (or that is not in a pod) pays no more than one short call a minute.

    One warning is one mount (container, GPU, mountedAt) until the reclaim it announces
    moves later (the GPU was used, the clock reset, and it was warned again) or the
    warning goes away.
    """

    config: Config | None = None
    timeout: float = 2.0
    backoff: float = 60.0
    stream: Any = None
    _shown: dict[tuple[str, str, str], float] = field(default_factory=dict)
    _quiet_until: float = 0.0
    # The last look saw a GPU under the idle policy `suspend`, or a suspended one: the
    # next cell asks first whether to resume (cli/notebook_suspend.py).
    suspendable: bool = False

    SLACK = 5.0  # seconds: the same warning's deadline, seen twice, moves by less

    def __call__(self, *_: Any) -> None:
        import time

        now = time.monotonic()
        if now < self._quiet_until:
            return
        try:
            devices = self._warned(now)
        except Exception:  # never a traceback under the user's cell
            self._quiet_until = time.monotonic() + self.backoff
            return
        lines = []
        for key, gpu, seconds, deadline, policy in devices:
            shown = self._shown.get(key)
            if shown is None or deadline > shown + self.SLACK:
                lines.append(f"%gpu: {gpu} will be {_reclaim_text(seconds, policy)}")
            self._shown[key] = deadline if shown is None else max(shown, deadline)
        for key in set(self._shown) - {d[0] for d in devices}:
            del self._shown[key]  # no longer warned: a new warning is said again
        if lines:
            print("\n".join(lines), file=self.stream or sys.stderr)

    def _warned(self, now: float) -> list[tuple[tuple[str, str, str], str, int, float, str | None]]:
        """(identity, `GPU 0`, seconds left, monotonic deadline, idle policy) per warned
        mount."""
        from cli.client import HotmountClient

        config = self.config or Config.from_env()
        verify: str | bool = str(config.ca_file) if config.ca_file else True
        with HotmountClient.for_agent(
            config.agent, config.token(), verify=verify, timeout=self.timeout
        ) as client:
            result = client.status(config.namespace, config.pod)
        self.suspendable = any(
            d.state == "suspended" or d.idle_policy == "suspend"
            for c in result.containers
            for d in c.devices
        )
        return [
            (
                (c.container_id, d.key, d.mounted_at or ""),
                f"GPU {d.index}" if d.index is not None else d.key,
                d.reclaim_in_seconds,
                now + d.reclaim_in_seconds,
                d.idle_policy,
            )
            for c in result.containers
            for d in c.devices
            if d.reclaim_in_seconds is not None
        ]


def _reclaim_text(seconds: int, policy: str | None) -> str:
    """`reclaimed in 4m unless used`, or under the policy `suspend` `suspended in ...`."""
    from cli.output import reclaim_text

    return reclaim_text(seconds, policy)


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
    global _resumes
    if _resumes is not None:
        _unregister(ipython, _resumes, "pre_run_cell")
    from cli.notebook_suspend import AutoResume

    watch = _warnings
    _resumes = AutoResume(
        config_of=Config.from_env,
        explain=lambda exc, config: error_message(exc, config, "resume"),
        watching=lambda: watch.suspendable,
    )
    ipython.events.register("pre_run_cell", _resumes)


def unload_ipython_extension(ipython: Any) -> None:
    global _warnings, _resumes
    if _warnings is not None:
        _unregister(ipython, _warnings)
        _warnings = None
    if _resumes is not None:
        _unregister(ipython, _resumes, "pre_run_cell")
        _resumes = None


def _unregister(ipython: Any, hook: Any, event: str = "post_run_cell") -> None:
    import contextlib

    with contextlib.suppress(ValueError):  # registered with another shell
        ipython.events.unregister(event, hook)


_warnings: ReclaimWarnings | None = None
_resumes: Any = None  # the AutoResume registered, if any
