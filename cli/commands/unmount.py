"""`nvcli unmount`: take hot-mounted devices out of a pod."""

from __future__ import annotations

from typing import Annotated

import typer

from cli.completion import complete_mounted
from cli.options import Common, split_refs
from cli.output import Waiting
from cli.reach import UsageError, check_modes, make_client, namespace_of, pick_target
from cli.wiring import (
    Force,
    Name,
    emit,
    local_engine,
    with_common,
)


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
    check_modes(opts)
    devices = split_refs(unmount)
    if bool(devices) == all_devices:
        raise UsageError("give --unmount DEVICES or --all (one of them)")
    kind, target = pick_target(opts, name, container)
    refs = devices or None
    if opts.local:
        emit(local_engine(opts).unmount(target or "", refs, force), opts)
        return
    with make_client(opts) as client, Waiting("unmounting..."):
        if kind == "container":
            result = client.unmount_container(target or "", refs, force)
        else:
            result = client.unmount(
                namespace_of(opts), target or "", refs, container=container, force=force
            )
    emit(result, opts)
