"""Errors that say what to do: one line for a failed call, with the flag, role or
command that would help, read off the agent's or the API server's refusal."""

from __future__ import annotations

import re
from typing import Any

from cli.options import Common, split_refs
from hotmount.wire.errors import Busy, HotmountClientError

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
