"""`nvcli mount`: GPUs (by name or by count) into a pod's containers, with what rides along."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from cli.completion import complete_gpus
from cli.options import Common, split_refs
from cli.output import Waiting
from cli.reach import UsageError, check_modes, make_client, namespace_of, pick_target
from cli.wiring import (
    Name,
    check_names,
    emit,
    local_engine,
    with_common,
)


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
    check_modes(opts)
    devices = split_refs(mount)
    if bool(devices) == (count is not None):
        raise UsageError("give --mount DEVICES or --count N (one of them)")
    containers = list(dict.fromkeys(container or []))
    if "*" in containers and len(containers) > 1:
        raise UsageError("--container '*' means every container: give it alone")
    single = containers[0] if len(containers) == 1 else None
    kind, target = pick_target(opts, name, single)
    if (opts.local or kind == "container") and (len(containers) > 1 or share_with):
        raise UsageError("several containers and --share-with work on pods, not with --local")
    if kind == "pod":
        check_names(containers, share_with)
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
        emit(local_engine(opts).mount(target or "", devices, force), opts)
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
