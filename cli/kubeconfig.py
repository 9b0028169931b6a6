"""Kubeconfig loading as kubectl does it, through the official client's loader.

Which file: `--kubeconfig`, else `$KUBECONFIG` (a `:`-separated list is merged),
else `~/.kube/config`. Which context: `--context`, else `current-context`.
Namespace: `-n`, else the context's `namespace`, else `default`.

The loader resolves everything a kubeconfig can hold (CA and client certificates,
inline or as files; static tokens and token files; exec plugins; auth
providers) into a `kubernetes.client.Configuration`; `aggregated_http_client`
turns that into an httpx client whose `Authorization` header is asked of the
loader on every request, so exec-plugin tokens are refreshed when they expire.
"""

from __future__ import annotations

import os
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from cli.client import DEFAULT_TIMEOUT, HotmountClientError, _BearerAuth, http_client, make_status

DEFAULT_KUBECONFIG = "~/.kube/config"


class KubeconfigError(HotmountClientError):
    """The kubeconfig is missing, unreadable, or lacks the context asked for (exit 1)."""


@dataclass
class KubeContext:
    path: str
    context: str | None
    namespace: str
    server: str
    configuration: Any  # kubernetes.client.Configuration


def resolve_path(kubeconfig: str | None = None) -> str:
    """The kubeconfig path (or `:`-list) kubectl would use."""
    if kubeconfig:
        return kubeconfig
    return os.environ.get("KUBECONFIG") or DEFAULT_KUBECONFIG


def _exists(path: str) -> bool:
    return any(Path(p).expanduser().is_file() for p in path.split(os.pathsep) if p)


def _error(message: str) -> KubeconfigError:
    return KubeconfigError(make_status(400, message, "InvalidKubeconfig"))


def context_namespace(kubeconfig: str | None = None, context: str | None = None) -> str:
    """The namespace of the context (`default` when it names none, or there is no file)."""
    path = resolve_path(kubeconfig)
    if not _exists(path):
        if kubeconfig or context:
            raise _error(f"kubeconfig {path} not found; pass --kubeconfig or set $KUBECONFIG")
        return "default"
    return _context_entry(path, context)[1]


def _context_entry(path: str, context: str | None) -> tuple[str | None, str]:
    from kubernetes.config import ConfigException, list_kube_config_contexts

    try:
        contexts, current = list_kube_config_contexts(config_file=path)
    except (ConfigException, OSError, ValueError) as exc:
        raise _error(f"cannot read kubeconfig {path}: {exc}") from exc
    context = context or _first_current_context(path)
    if context is None:
        entry = current
    else:
        entry = next((c for c in contexts if c.get("name") == context), None)
        if entry is None:
            names = ", ".join(c.get("name", "?") for c in contexts) or "none"
            raise _error(f"context {context!r} not found in {path} (contexts: {names})")
    if not entry:
        raise _error(f"{path} has no current-context; pass --context")
    namespace = (entry.get("context") or {}).get("namespace") or "default"
    return entry.get("name"), namespace


def _first_current_context(path: str) -> str | None:
    """kubectl's merge rule: the first file that sets current-context wins.

    (The Python loader lets the last one win, which is not what an operator expects.)
    """
    import yaml

    for part in path.split(os.pathsep):
        file = Path(part).expanduser()
        if not part or not file.is_file():
            continue
        try:
            data = yaml.safe_load(file.read_text()) or {}
        except (OSError, yaml.YAMLError):
            continue
        if isinstance(data, dict) and data.get("current-context"):
            return str(data["current-context"])
    return None


def load(kubeconfig: str | None = None, context: str | None = None) -> KubeContext:
    """Resolve the kubeconfig and context into server URL, TLS material and credentials."""
    from kubernetes.client import Configuration
    from kubernetes.config import ConfigException, load_kube_config

    path = resolve_path(kubeconfig)
    if not _exists(path):
        raise _error(
            f"no kubeconfig at {path}; pass --kubeconfig, set $KUBECONFIG, "
            "or call an agent directly with --agent URL"
        )
    name, namespace = _context_entry(path, context)
    cfg = Configuration()
    try:
        load_kube_config(
            config_file=path, context=name, client_configuration=cfg, persist_config=False
        )
    except (ConfigException, OSError, ValueError) as exc:
        raise _error(f"cannot use context {name!r} of {path}: {exc}") from exc
    return KubeContext(path, name, namespace, cfg.host, cfg)


def ssl_context(cfg: Any) -> ssl.SSLContext:
    """Server verification and the client certificate, from a `Configuration`."""
    context = ssl.create_default_context(cafile=cfg.ssl_ca_cert or None)
    if not cfg.verify_ssl:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    if cfg.cert_file:
        context.load_cert_chain(cfg.cert_file, cfg.key_file or None)
    return context


def authorization(cfg: Any) -> str | None:
    """The `Authorization` header value, refreshed through the loader's hook."""
    value = cfg.get_api_key_with_prefix("BearerToken", alias="authorization")
    if value:
        return str(value)
    if cfg.username or cfg.password:
        return str(cfg.get_basic_auth_token())
    return None


def aggregated_http_client(
    kube: KubeContext,
    *,
    timeout: float | None = DEFAULT_TIMEOUT,
    transport: httpx.BaseTransport | None = None,
) -> httpx.Client:
    cfg = kube.configuration
    tls_server_name = getattr(cfg, "tls_server_name", None)
    client = http_client(
        kube.server,
        verify=ssl_context(cfg),
        auth=_BearerAuth(provider=lambda: authorization(cfg)),
        timeout=timeout,
        proxy=cfg.proxy or None,
        transport=transport,
    )
    if tls_server_name:

        def _sni(request: httpx.Request) -> None:
            request.extensions["sni_hostname"] = tls_server_name

        client.event_hooks["request"].insert(0, _sni)
    return client
