"""From the common flags to what a command needs: the client that reaches the agent, the
pod's namespace, durations. Its own module so that cli.main and the shell completers
(cli.completion) both build the client the same way and neither imports the other."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from cli.options import Common
from hotmount.wire.errors import DEFAULT_TIMEOUT

if TYPE_CHECKING:
    from cli.client import HotmountClient


class UsageError(Exception):
    """A command line that cannot work: printed with the usage, exit 2."""


_NUM = r"(\d+(?:\.\d+)?)"
_DURATION = re.compile(rf"(?:{_NUM}h)?(?:{_NUM}m(?!s))?(?:{_NUM}s)?(?:{_NUM}ms)?")


def parse_duration(text: str | None) -> float | None:
    """kubectl's durations: `30s`, `2m`, `1h`, `1m30s`, `500ms`, bare seconds; 0: no limit."""
    if text is None:
        return DEFAULT_TIMEOUT
    text = text.strip()
    try:
        seconds = float(text)
    except ValueError:
        match = _DURATION.fullmatch(text)
        if not text or match is None:
            raise UsageError(f"{text!r} is not a duration (e.g. 30s, 2m, 1m30s)") from None
        h, m, s, ms = (float(g) if g else 0.0 for g in match.groups())
        seconds = h * 3600 + m * 60 + s + ms / 1000
    if seconds < 0:
        raise UsageError("must not be negative")
    return seconds or None


def namespace_of(opts: Common) -> str:
    if opts.namespace:
        return opts.namespace
    from cli.transport.kubeconfig import context_namespace  # reads the kubeconfig's YAML

    return context_namespace(opts.kubeconfig, opts.context)


def make_client(opts: Common) -> HotmountClient:
    from cli.client import HotmountClient

    timeout = parse_duration(opts.timeout)
    if opts.agent:
        token = opts.token
        if token is None and opts.token_file is not None:
            try:
                token = opts.token_file.read_text().strip()
            except OSError as exc:
                raise UsageError(str(exc)) from None
        verify: Any = True
        if opts.insecure_skip_tls_verify:
            verify = False
        elif opts.certificate_authority is not None:
            verify = str(opts.certificate_authority)
        if token:
            from cli.transport.cleartext import refuse_plain_credentials

            try:
                refuse_plain_credentials(opts.agent, "the --token")
            except ValueError as exc:
                raise UsageError(str(exc)) from None
        return HotmountClient.for_agent(opts.agent, token, verify=verify, timeout=timeout)
    if opts.token or opts.token_file:
        raise UsageError("--token and --token-file go with --agent URL")
    return HotmountClient.from_kubeconfig(opts.kubeconfig, opts.context, timeout=timeout)


def check_modes(opts: Common) -> None:
    if opts.local and opts.agent:
        raise UsageError("--local and --agent exclude each other")
    if not opts.local and (opts.host_root or opts.cdi_dir or opts.state_dir):
        raise UsageError("--host-root, --cdi-dir and --state-dir go with --local")


def pick_target(opts: Common, name: str | None, container: str | None) -> tuple[str, str | None]:
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
