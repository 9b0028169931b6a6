"""What `%gpu` says: one line (or one per GPU) for each result, and for each error one
line a notebook user understands, never a traceback."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from cli.notebook.config import NotebookError

if TYPE_CHECKING:
    from cli.notebook.config import Config
    from hotmount.wire.schemas import DeviceList, MountResult, PodDevices, UnmountResult


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
    from hotmount.wire.durations import format_duration

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
    from hotmount.wire.errors import (
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
