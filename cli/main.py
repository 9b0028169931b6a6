"""`nvcli`: hot-mount GPUs into running pods, from a laptop with a kubeconfig.

Wiring only: flags are parsed here, the work is done by `cli.client` (through the
API server's aggregated API, or straight to an agent with `--agent`) or by the
engine in-process (`--local`). Exit codes, for scripts:

    0 success   1 error   2 usage or bad request   3 busy or conflict
    4 not found   5 unauthenticated or forbidden (or --local without root)   6 timeout

`nvcli list` exits 0 with the nodes that answered when some did not: each of those is a
`warning:` line on stderr, and an entry with `unavailable` in `-o json`/`-o yaml`.
"""

from __future__ import annotations

import functools
import inspect
import logging
import re
import sys
from collections.abc import Callable
from dataclasses import fields
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, get_type_hints

import typer

from cli import __version__
from cli.commands import suspend as suspend_commands
from cli.completion import (
    SHELLS,
    complete_gpus,
    complete_mounted,
    complete_pods,
    complete_var,
)
from cli.errors import DEFAULT_TIMEOUT, EXIT_USAGE, Busy, HotmountClientError
from cli.options import Common, OutputFormat
from cli.output import Waiting, printable, render, status_table
from cli.reach import UsageError, make_client, namespace_of

if TYPE_CHECKING:
    pass

# Start-up time is most of a call's wall time (docs/api.md, "nvcli"): this module imports
# typer and the cheap cli.errors and cli.output only. The client (cli.client, cli.http),
# pydantic and the agent's models, the kubeconfig reader and the engine (cli.local) are
# imported by the commands that use them; tests/cli/test_imports.py holds that.

app = typer.Typer(
    name="nvcli",
    help="Hot-mount GPUs into running pods, and take them away, without a restart.\n\n"
    "Example:\n\n  nvcli mount --name notebook-0 --mount 0",
    rich_markup_mode=None,
    pretty_exceptions_enable=False,
    no_args_is_help=True,
    context_settings={"help_option_names": ["-h", "--help"]},
)


# -- options every command takes, kubectl's names -------------------------------------------


_COMMON_OPTIONS: dict[str, Any] = {
    "kubeconfig": Annotated[
        str | None,
        typer.Option(
            "--kubeconfig",
            metavar="PATH",
            help="kubeconfig file (default: $KUBECONFIG, then ~/.kube/config)",
            show_default=False,
        ),
    ],
    "context": Annotated[
        str | None, typer.Option("--context", metavar="NAME", help="kubeconfig context")
    ],
    "namespace": Annotated[
        str | None,
        typer.Option(
            "-n", "--namespace", metavar="NS", help="the pod's namespace (default: the context's)"
        ),
    ],
    "v": Annotated[
        int | None,
        typer.Option(
            "-v",
            "--v",
            metavar="LEVEL",
            min=0,
            max=10,
            help="log verbosity 0-10: 4 logs each HTTP call, 6 adds headers and bodies",
        ),
    ],
    "timeout": Annotated[
        str | None,
        typer.Option(
            "--timeout",
            metavar="DURATION",
            help=f"bound on each HTTP call: 30s, 2m, 1m30s; 0 waits forever "
            f"(default {int(DEFAULT_TIMEOUT)}s)",
        ),
    ],
    "output": Annotated[
        OutputFormat | None,
        typer.Option(
            "-o", "--output", metavar="table|json|yaml", help="output format (default table)"
        ),
    ],
    "agent": Annotated[
        str | None,
        typer.Option("--agent", metavar="URL", help="call this agent URL directly (its /v1 API)"),
    ],
    "token": Annotated[
        str | None, typer.Option("--token", metavar="TOKEN", help="bearer token for --agent")
    ],
    "token_file": Annotated[
        Path | None,
        typer.Option(
            "--token-file", metavar="PATH", help="file holding the bearer token for --agent"
        ),
    ],
    "certificate_authority": Annotated[
        Path | None,
        typer.Option(
            "--certificate-authority",
            metavar="PATH",
            help="CA that signed the --agent's certificate (default: the system's trust store)",
        ),
    ],
    "insecure_skip_tls_verify": Annotated[
        bool,
        typer.Option("--insecure-skip-tls-verify", help="do not verify the --agent's certificate"),
    ],
    "local": Annotated[
        bool,
        typer.Option("--local", help="run the engine in-process (no Kubernetes; needs root)"),
    ],
    "host_root": Annotated[
        Path | None,
        typer.Option("--host-root", metavar="DIR", help="--local: where the host's / is"),
    ],
    "cdi_dir": Annotated[
        list[str] | None,
        typer.Option("--cdi-dir", metavar="DIR", help="--local: CDI spec directory (repeatable)"),
    ],
    "state_dir": Annotated[
        Path | None,
        typer.Option("--state-dir", metavar="DIR", help="--local: the engine's ledger directory"),
    ],
}
_COMMON_DEFAULTS = {f.name: f.default for f in fields(Common)}


def with_common(func: Callable[..., None]) -> Callable[..., None]:
    """Add the common options to a command; it receives them as `opts: Common`."""
    hints = get_type_hints(func, include_extras=True)
    own = [
        p.replace(annotation=hints[p.name])
        for p in inspect.signature(func).parameters.values()
        if p.name != "opts"
    ]
    extra = [
        inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=_COMMON_DEFAULTS[name],
                          annotation=annotation)
        for name, annotation in _COMMON_OPTIONS.items()
    ]  # fmt: skip

    @functools.wraps(func)
    def wrapper(ctx: typer.Context, **kwargs: Any) -> None:
        common = Common(**{name: kwargs.pop(name) for name in _COMMON_OPTIONS})
        opts = common.merged(ctx.find_object(Common))
        if ctx.obj is None:  # the root callback: commands merge these with their own
            ctx.obj = opts
        _setup_logging(opts.v or 0)
        try:
            func(opts=opts, **kwargs)
        except UsageError as err:
            typer.echo(ctx.get_usage(), err=True)
            typer.echo(f"Try '{ctx.command_path} -h' for help.\n", err=True)
            typer.echo(f"Error: {err}", err=True)
            raise typer.Exit(EXIT_USAGE) from None
        except HotmountClientError as err:
            typer.echo(f"error: {printable(explain(err, kwargs, opts))}", err=True)
            raise typer.Exit(err.exit_code) from None

    ctx_param = inspect.Parameter("ctx", inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                  annotation=typer.Context)  # fmt: skip
    params = [ctx_param, *own, *extra]
    wrapper.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    wrapper.__annotations__ = {p.name: p.annotation for p in params}
    return wrapper


@app.callback()
@with_common
def _root(opts: Common) -> None:
    """Hot-mount GPUs into running pods, and take them away, without a restart.

    Flags may come before or after the command, as with kubectl.

    \b
    Example:
      nvcli mount --name notebook-0 --mount 0
    """


# -- logging, durations, the namespace ----------------------------------------------------------


class _KlogFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        stamp = self.formatTime(record, "%m%d %H:%M:%S") + f".{int(record.msecs * 1000):06d}"
        where = f"{record.filename}:{record.lineno}"
        return f"{record.levelname[0]}{stamp} {record.process:>7} {where}] {record.getMessage()}"


def _setup_logging(verbosity: int) -> None:
    logger = logging.getLogger("nvcli")
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(_KlogFormatter())
        logger.addHandler(handler)
        logger.propagate = False
    if verbosity >= 6:
        logger.setLevel(logging.DEBUG)
    elif verbosity >= 4:
        logger.setLevel(logging.INFO)
    else:
        logger.setLevel(logging.WARNING)


def split_refs(values: list[str] | None) -> list[str]:
    """`--mount 0,1`, `--mount=0 --mount 1`: one flat list, duplicates kept once."""
    refs = [part.strip() for value in values or [] for part in value.split(",")]
    return list(dict.fromkeys(r for r in refs if r))


# -- reaching the agent ---------------------------------------------------------------------------


def _check_modes(opts: Common) -> None:
    if opts.local and opts.agent:
        raise UsageError("--local and --agent exclude each other")
    if not opts.local and (opts.host_root or opts.cdi_dir or opts.state_dir):
        raise UsageError("--host-root, --cdi-dir and --state-dir go with --local")


def emit(result: Any, opts: Common) -> None:
    typer.echo(render(result, opts.fmt))


# -- errors that say what to do -------------------------------------------------------------------


def _device_words(refs: list[str]) -> str:
    named = [f"GPU {r}" if r.isdigit() else r for r in refs]
    return ", ".join(named) if named else "the device"


def explain(err: HotmountClientError, args: dict[str, Any], opts: Common) -> str:
    """One line: what went wrong, and what to do about it."""
    details = err.details
    refs = split_refs(args.get("mount") or args.get("unmount")) or (
        [args["gpu"]] if args.get("gpu") else []
    )
    device = details.get("device") or details.get("name")
    what = _device_words([str(device)] if device and not refs else refs)
    container = details.get("container") or args.get("container")
    if isinstance(container, list):  # mount's --container may be repeated
        container = ", ".join(container)
    if isinstance(err, Busy) and err.holders:
        procs = ", ".join(f"PID {h.get('pid')} ({h.get('command') or '?'})" for h in err.holders)
        where = f" in container {container}" if container else ""
        them = "it" if len(err.holders) == 1 else "them"
        return f"{what} is in use by {procs}{where}; retry with --force to stop {them}"
    hint = _HINTS.get(err.reason) or _HINTS_BY_CODE.get(err.code, "")
    if err.code == 403 and not opts.local:
        hint = permission_hint(err, opts, _command_verb(args))
    if err.reason == "NotFound" and "could not find the requested resource" in err.message:
        hint = (
            "the API server does not serve hotmount.io/v1alpha1: is the APIService "
            "v1alpha1.hotmount.io installed and Available? (kubectl get apiservice)"
        )
    if opts.agent and err.code == 401:
        hint = "pass a valid token with --token or --token-file"
    return f"{err.message}; {hint}" if hint else err.message


_HINTS = {
    "DeviceBusy": "retry with --force to stop the processes that hold it",
    "DeviceClaimed": "it is hot-mounted elsewhere: unmount it there first, or use nvcli move",
    "AllocatedToPod": "the kubelet gave it to another running pod; --force mounts it anyway",
    "PodNotRunning": "wait until the pod is Running (kubectl get pod), then retry",
    "Unschedulable": "no free GPU for the holder pod on the pod's node; free one or ask for fewer",
    "UnsafePath": "a file that is not the device node is in the way in the container's /dev",
    "PodNotFound": "check the pod name and the namespace (-n)",
    "ContainerNotFound": "name the container with --container",
    "DeviceNotFound": "nvcli list shows the node's devices",
    "InvalidDevice": "name a device by index, UUID or CDI name (nvcli list)",
    "InvalidContainer": "name the container with --container",
    "NotReady": "the agent is starting or cannot reach its node; retry shortly",
    "Timeout": "raise --timeout, or check the agent (and for --count, the holder pod)",
    "InvalidKubeconfig": "",
}
_HINTS_BY_CODE = {
    401: "your kubeconfig's credentials were not accepted; log in again (kubectl auth whoami)",
    503: "the agent is unavailable; retry shortly, or check it (kubectl -n gpu-hotmount get pods)",
}


_RESOURCE = re.compile(r'\b(gpumounts|nodedevices|reassignments)(?:\.hotmount\.io|")')
_NAMESPACE = re.compile(r'in the namespace "([^"]+)"')


def _command_verb(args: dict[str, Any]) -> tuple[str, str]:
    """(verb, resource) a command needs, for refusals that do not say."""
    if "unmount" in args:
        return "delete", "gpumounts"
    if "mount" in args or "gpu" in args:
        return "create", "gpumounts"
    if "node" in args:
        return "list", "nodedevices"
    return "get", "gpumounts"


def permission_hint(err: HotmountClientError, opts: Common, needs: tuple[str, str]) -> str:
    """What to ask for, read off the refusal: the API server's (`... cannot create resource
    "reassignments" in API group "hotmount.io" at the cluster scope`) or the agent's
    (`user "u" cannot force gpumounts.hotmount.io in the namespace "ns" (pod ns/p)`)."""
    message, details = err.message, err.details
    verb_match = re.search(r"cannot (\w+)", message)
    verb = verb_match.group(1) if verb_match else needs[0]
    resource = details.get("kind") if details.get("group") == "hotmount.io" else None
    if resource is None:
        found = _RESOURCE.search(message)
        resource = found.group(1) if found else needs[1]
    cluster_scope = "at the cluster scope" in message
    found_ns = _NAMESPACE.search(message)
    namespace = found_ns.group(1) if found_ns else (opts.namespace or "your namespace")
    if verb == "force":
        return (
            f"ask for force on gpumounts.hotmount.io in namespace {namespace} "
            "(ClusterRole hotmount-admin): hotmount-user and edit do not carry it"
        )
    if resource == "nodedevices":
        return (
            f"ask for {verb} on nodedevices.hotmount.io at the cluster scope (a "
            "ClusterRoleBinding to ClusterRole hotmount-viewer): the listing shows GPU holders "
            "in every namespace; nvcli status --name POD shows your pod's"
        )
    if resource == "reassignments" and cluster_scope:
        return (
            "moving a GPU between namespaces needs create on reassignments.hotmount.io at the "
            "cluster scope (a ClusterRoleBinding to ClusterRole hotmount-user)"
        )
    return (
        f"ask for {verb} on {resource}.hotmount.io in namespace {namespace} "
        "(ClusterRole hotmount-user through a RoleBinding, or the edit role)"
    )


# -- commands -------------------------------------------------------------------------------------

Name = Annotated[
    str | None,
    typer.Option("--name", metavar="POD", help="the pod", autocompletion=complete_pods),
]
Force = Annotated[bool, typer.Option("--force", help="stop processes holding the device")]


def _local(opts: Common) -> Any:
    """`--local`: the engine in this process (cli.local), imported only then."""
    from cli.local import LocalEngine

    return LocalEngine(opts)


def _check_names(containers: list[str], share_with: str | None) -> None:
    """Name the flag, not the wire field, when a name cannot be one (before any request)."""
    from agent.schemas import ContainerName, KubeName

    for value in containers:
        if value != "*" and not _valid(ContainerName, value):
            raise UsageError(
                f"--container {value!r} is not a container name "
                "(lower-case letters, digits and '-'), nor '*'"
            )
    if share_with is not None and not _valid(KubeName, share_with):
        raise UsageError(
            f"--share-with {share_with!r} is not a pod name: give a pod of the same "
            "namespace (lower-case letters, digits, '-' and '.'; no namespace/)"
        )


def _valid(kind: Any, value: str) -> bool:
    from pydantic import TypeAdapter, ValidationError

    try:
        TypeAdapter(kind).validate_python(value)
    except ValidationError:
        return False
    return True


def _target(opts: Common, name: str | None, container: str | None) -> tuple[str, str | None]:
    """('pod', name) or ('container', ID): what a mount, unmount or status is about."""
    if opts.local:
        if name:
            raise UsageError("--local works on containers: --container ID, not --name")
        if not container:
            raise UsageError("--local needs --container ID")
        return "container", container
    if name:
        return "pod", name
    if opts.agent and container:
        return "container", container  # a standalone agent (hotmount-agent --no-kubernetes)
    raise UsageError("Missing option '--name' (the pod)")


@app.command()
@with_common
def mount(
    opts: Common,
    name: Name = None,
    mount: Annotated[
        list[str] | None,
        typer.Option(
            "--mount",
            metavar="DEVICES",
            help="devices: indices, UUIDs or CDI names; comma-separated or repeated",
            autocompletion=complete_gpus,
        ),
    ] = None,
    count: Annotated[
        int | None,
        typer.Option(
            "--count", metavar="N", min=1, max=64, help="N GPUs, accounted with the scheduler"
        ),
    ] = None,
    container: Annotated[
        list[str] | None,
        typer.Option(
            "--container",
            metavar="NAME",
            help="container name (default: the first); repeat it, or '*' for every container "
            "of the pod (they share the GPU); ID with --local",
        ),
    ] = None,
    share_with: Annotated[
        str | None,
        typer.Option(
            "--share-with",
            metavar="POD",
            help="share the GPU a pod of the same namespace holds (CUDA IPC); you need "
            "create on both pods",
        ),
    ] = None,
    force: Annotated[
        bool,
        typer.Option(
            "--force", help="mount even if another pod holds it (needs the force permission)"
        ),
    ] = False,
    with_rdma: Annotated[
        bool,
        typer.Option(
            "--with-rdma",
            help="also the RDMA device of the NIC nearest each GPU (same PCIe switch, else "
            "NUMA node): /dev/infiniband/uverbsN and rdma_cm, unmounted with the GPU",
        ),
    ] = False,
    with_driver: Annotated[
        bool | None,
        typer.Option(
            "--with-driver/--without-driver",
            help="also the driver's libraries and tools (libcuda, nvidia-smi) for a pod "
            "started without the NVIDIA runtime; prints what to export (default: the "
            "node's --inject-driver, auto)",
        ),
    ] = None,
    rdma: Annotated[
        list[str] | None,
        typer.Option(
            "--rdma", metavar="DEVICES", help="RDMA devices by name (rdma/mlx5_0), with the GPUs"
        ),
    ] = None,
    with_netdev: Annotated[
        bool,
        typer.Option(
            "--with-netdev",
            help="also move the RDMA NIC's network interface into the pod (as net1); "
            "the agent's --netdev-allow must list it",
        ),
    ] = False,
    netdev: Annotated[
        str | None,
        typer.Option("--netdev", metavar="IFACE", help="move this host interface into the pod"),
    ] = None,
    netdev_inside: Annotated[
        str | None,
        typer.Option("--netdev-inside", metavar="NAME", help="its name in the pod (net1)"),
    ] = None,
    netdev_mtu: Annotated[
        int | None, typer.Option("--netdev-mtu", metavar="MTU", help="its MTU in the pod")
    ] = None,
    netdev_address: Annotated[
        list[str] | None,
        typer.Option(
            "--netdev-address", metavar="CIDR", help="an address for it (10.0.0.2/24); repeat"
        ),
    ] = None,
    once: Annotated[
        bool,
        typer.Option(
            "--once",
            help="this container only: not mounted again if the container restarts",
        ),
    ] = False,
) -> None:
    """Hot-mount GPUs into a running pod.

    A GPU has one holder, whatever it is called (index, UUID, CDI name, `=all`, a MIG
    instance of it): another pod asking for it gets a conflict naming the holder.
    Containers of one pod may share it; another pod only with --share-with.

    \b
    Example:
      nvcli mount --name notebook-0 --mount 0
      nvcli mount --name notebook-0 -n ml --mount=0,GPU-8f3b... --container main
      nvcli mount --name ipc-pod --mount 0 --container producer --container consumer
      nvcli mount --name consumer-0 --mount 0 --share-with producer-0
      nvcli mount --name notebook-0 --count 2
      nvcli mount --name trainer-0 --mount 0 --with-rdma --with-netdev
      nvcli mount --name cpu-notebook-0 --mount 0 --with-driver
      nvcli mount --name trainer-0 --mount 0 --rdma rdma/mlx5_1 --netdev ens1f0v2
      sudo nvcli mount --local --container 3f2a... --mount 0
    """
    _check_modes(opts)
    devices = split_refs(mount)
    if bool(devices) == (count is not None):
        raise UsageError("give --mount DEVICES or --count N (one of them)")
    containers = list(dict.fromkeys(container or []))
    if "*" in containers and len(containers) > 1:
        raise UsageError("--container '*' means every container: give it alone")
    single = containers[0] if len(containers) == 1 else None
    kind, target = _target(opts, name, single)
    if (opts.local or kind == "container") and (len(containers) > 1 or share_with):
        raise UsageError("several containers and --share-with work on pods, not with --local")
    if kind == "pod":
        _check_names(containers, share_with)
    riders = _riders(with_rdma, rdma, with_netdev, netdev, netdev_inside, netdev_mtu)
    if netdev_address:
        riders.setdefault("netdev", {})["addresses"] = netdev_address
    if riders and (opts.local or kind == "container"):
        raise UsageError("--with-rdma, --rdma and the netdev flags work on pods, not --local")
    if once:
        if opts.local or kind == "container":
            raise UsageError("--once is for pods: a container by ID is never mounted again")
        riders["once"] = True
    if with_driver is not None:
        if opts.local or kind == "container":
            raise UsageError("--with-driver works on pods (locally: python -m hotmount mount)")
        riders["with_driver"] = with_driver
    if opts.local:
        if count is not None:
            raise UsageError("--count needs the scheduler: it does not work with --local")
        emit(_local(opts).mount(target or "", devices, force), opts)
        return
    with make_client(opts) as client:
        waiting = "waiting for a holder pod to be scheduled" if count else "mounting"
        with Waiting(f"{waiting}..."):
            if kind == "container":
                result = client.mount_container(target or "", devices, force)
            else:
                result = client.mount(
                    namespace_of(opts),
                    target or "",
                    devices=devices or None,
                    count=count,
                    container=containers or None,
                    force=force,
                    share_with=share_with,
                    **riders,
                )
    emit(result, opts)


def _riders(
    with_rdma: bool,
    rdma: list[str] | None,
    with_netdev: bool,
    netdev: str | None,
    inside: str | None,
    mtu: int | None,
) -> dict[str, Any]:
    """What comes with the GPUs, as the MountRequest names it (only what was asked for)."""
    out: dict[str, Any] = {}
    if with_rdma:
        out["with_rdma"] = True
    if rdma:
        out["rdma"] = split_refs(rdma)
    if with_netdev:
        out["with_netdev"] = True
    spec = {"name": netdev, "inside": inside, "mtu": mtu}
    spec = {k: v for k, v in spec.items() if v is not None}
    if spec:
        out["netdev"] = spec
    return out


@app.command()
@with_common
def unmount(
    opts: Common,
    name: Name = None,
    unmount: Annotated[
        list[str] | None,
        typer.Option(
            "--unmount",
            metavar="DEVICES",
            help="devices to take away; comma-separated or repeated",
            autocompletion=complete_mounted,
        ),
    ] = None,
    all_devices: Annotated[
        bool, typer.Option("--all", help="take away every hot-mounted device")
    ] = False,
    container: Annotated[
        str | None,
        typer.Option("--container", metavar="NAME", help="container name; ID with --local"),
    ] = None,
    force: Force = False,
) -> None:
    """Take hot-mounted GPUs away from a running pod.

    Refused while a process holds a device open, unless --force (which stops it).

    \b
    Example:
      nvcli unmount --name notebook-0 --unmount 0
      nvcli unmount --name notebook-0 --unmount=0,1 --force
      nvcli unmount --name notebook-0 --all
    """
    _check_modes(opts)
    devices = split_refs(unmount)
    if bool(devices) == all_devices:
        raise UsageError("give --unmount DEVICES or --all (one of them)")
    kind, target = _target(opts, name, container)
    refs = devices or None
    if opts.local:
        emit(_local(opts).unmount(target or "", refs, force), opts)
        return
    with make_client(opts) as client, Waiting("unmounting..."):
        if kind == "container":
            result = client.unmount_container(target or "", refs, force)
        else:
            result = client.unmount(
                namespace_of(opts), target or "", refs, container=container, force=force
            )
    emit(result, opts)


@app.command()
@with_common
def status(
    opts: Common,
    name: Name = None,
    container: Annotated[
        str | None,
        typer.Option("--container", metavar="NAME", help="only this container; ID with --local"),
    ] = None,
) -> None:
    """Show what is hot-mounted in a pod.

    \b
    Example:
      nvcli status --name notebook-0 -n ml
      nvcli status --name notebook-0 -o yaml
    """
    _check_modes(opts)
    kind, target = _target(opts, name, container)
    if opts.local:
        emit(_local(opts).status(target or ""), opts)
        return
    # The reply as the agent sent it: rendered without pydantic or the models, which
    # would cost more than the request itself (bench/cli_bench.py).
    with make_client(opts) as client:
        if kind == "container":
            doc = client.container_status_document(target or "")
        else:
            doc = client.status_document(namespace_of(opts), target or "")
    if container and kind == "pod":
        doc["containers"] = [c for c in doc["containers"] if c.get("container") == container]
    if opts.fmt == "table":
        typer.echo(status_table(doc))
    else:
        emit(doc, opts)


@app.command("list")
@with_common
def list_(
    opts: Common,
    node: Annotated[
        str | None, typer.Option("--node", metavar="NODE", help="only this node")
    ] = None,
) -> None:
    """List the devices on a node and who holds each.

    \b
    Example:
      nvcli list --node gpu-node-1
      nvcli list -o json
    """
    _check_modes(opts)
    if opts.local:
        emit(_local(opts).list_devices(), opts)
        return
    with make_client(opts) as client:
        result = client.list_devices(node)
    from cli.partial import warning_lines

    for line in warning_lines(result):
        typer.echo(line, err=True)
    emit(result, opts)


@app.command()
@with_common
def move(
    opts: Common,
    gpu: Annotated[
        str, typer.Option("--gpu", metavar="DEVICE", help="the device: index, UUID or CDI name")
    ],
    from_: Annotated[
        str,
        typer.Option(
            "--from", metavar="POD", help="the pod that has it (container ID with --local)"
        ),
    ],
    to: Annotated[
        str,
        typer.Option(
            "--to", metavar="POD", help="the pod that gets it (container ID with --local)"
        ),
    ],
    from_namespace: Annotated[
        str | None,
        typer.Option("--from-namespace", metavar="NS", help="default: -n, then the context's"),
    ] = None,
    to_namespace: Annotated[
        str | None,
        typer.Option("--to-namespace", metavar="NS", help="default: -n, then the context's"),
    ] = None,
    from_container: Annotated[str | None, typer.Option("--from-container", metavar="NAME")] = None,
    to_container: Annotated[str | None, typer.Option("--to-container", metavar="NAME")] = None,
    force: Force = False,
) -> None:
    """Move a GPU from one pod to another (unmount there, mount here).

    \b
    Example:
      nvcli move --gpu 0 --from notebook-0 --to notebook-1
      nvcli move --gpu 0 --from a --from-namespace team-a --to b --to-namespace team-b --force
    """
    _check_modes(opts)
    if opts.local:
        emit(_local(opts).move(gpu, from_, to, force), opts)
        return
    default_ns = None if (from_namespace and to_namespace) else namespace_of(opts)
    src = (from_namespace or default_ns or "", from_, from_container)
    dst = (to_namespace or default_ns or "", to, to_container)
    with make_client(opts) as client, Waiting("moving..."):
        result = client.move(gpu, src, dst, force=force)
    emit(result, opts)


@app.command()
@with_common
def version(opts: Common) -> None:
    """Print nvcli's version.

    \b
    Example:
      nvcli version
      nvcli version -o json
    """
    if opts.fmt == "table":
        typer.echo(f"nvcli {__version__}")
        return
    emit({"clientVersion": {"version": __version__}}, opts)


@app.command()
def completion(
    ctx: typer.Context,
    shell: Annotated[str, typer.Argument(metavar="bash|zsh", help="the shell")],
) -> None:
    """Print the shell code that completes commands, flags, pods and GPUs.

    \b
    Example:
      nvcli completion bash > ~/.local/share/bash-completion/completions/nvcli
      echo 'source <(nvcli completion zsh)' >> ~/.zshrc
    """
    from typer.completion import completion_init

    from cli.completion import script

    if shell not in SHELLS:
        typer.echo(f"Error: no completion for {shell!r}: use one of {', '.join(SHELLS)}", err=True)
        raise typer.Exit(EXIT_USAGE)
    completion_init()  # typer's classes for each shell, which its completion answers with
    root = ctx.find_root()
    executable = "kubectl-gpu" if root.info_name == PLUGIN_NAME else "nvcli"
    typer.echo(script(root.command, shell, executable), nl=False)


# kubectl runs a plugin `kubectl gpu ARGS` as the executable `kubectl-gpu` on PATH, with
# ARGS as they were typed: kubectl's --kubeconfig, --context and -n among them.
PLUGIN_NAME = "kubectl gpu"


suspend_commands.register(app, with_common)  # cli/commands/suspend.py


def program_name(argv0: str) -> str:
    """`kubectl gpu` when run as the kubectl plugin (its usage lines say so), else nvcli."""
    return PLUGIN_NAME if Path(argv0).name.startswith("kubectl-gpu") else "nvcli"


def main(argv: list[str] | None = None) -> int:
    """The `nvcli` and `kubectl-gpu` console scripts; returns (and exits with) the status."""
    try:
        name = program_name(sys.argv[0])
        app(args=argv, prog_name=name, complete_var=complete_var(name), standalone_mode=True)
    except SystemExit as exc:
        code = exc.code
        if code is None:
            return 0
        if isinstance(code, int):
            return code
        print(code, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
