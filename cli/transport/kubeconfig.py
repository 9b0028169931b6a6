"""Kubeconfig loading as kubectl does it.

Which file: `--kubeconfig`, else `$KUBECONFIG` (a `:`-separated list is merged: the
first file to name a cluster, user or context, or to set `current-context`, wins),
else `~/.kube/config`. Which context: `--context`, else `current-context`.
Namespace: `-n`, else the context's `namespace`, else `default`.

Static credentials (CA and client certificates, inline or as files; tokens and token
files; basic auth) are read here from the YAML: the official `kubernetes` package
costs a fifth of a second to import, more than the call nvcli makes. A user with an
`exec` plugin or an `auth-provider` is handed to that package's loader, which runs the
plugin; `aggregated_http_client` then asks it for the `Authorization` header on every
request, so plugin tokens are refreshed when they expire.
"""

from __future__ import annotations

import base64
import os
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from cli.transport.cleartext import refuse_plain_credentials
from hotmount.wire.errors import DEFAULT_TIMEOUT, HotmountClientError, make_status

if TYPE_CHECKING:
    from cli.transport.http import HttpClient

DEFAULT_KUBECONFIG = "~/.kube/config"
_PLUGIN_KEYS = ("exec", "auth-provider")


class KubeconfigError(HotmountClientError):
    """The kubeconfig is missing, unreadable, or lacks the context asked for (exit 1)."""


@dataclass
class KubeContext:
    path: str
    context: str | None
    namespace: str
    server: str
    configuration: Any  # StaticConfiguration, or kubernetes.client.Configuration for plugins


@dataclass
class StaticConfiguration:
    """What a kubeconfig user without plugins resolves to; the names are the official
    client's `Configuration` attributes that `ssl_context` and `aggregated_http_client` read."""

    host: str
    ssl_ca_cert: str | None = None
    ca_data: str | None = None  # PEM, from certificate-authority-data
    cert_file: str | None = None
    key_file: str | None = None
    cert_data: bytes | None = None  # PEM, from client-certificate-data / client-key-data
    key_data: bytes | None = None
    verify_ssl: bool = True
    tls_server_name: str | None = None
    proxy: str | None = None
    authorization: str | None = None


@dataclass
class _Merged:
    """The `:`-list merged: name -> (entry, directory of the file it came from)."""

    clusters: dict[str, tuple[dict[str, Any], str]]
    users: dict[str, tuple[dict[str, Any], str]]
    contexts: dict[str, tuple[dict[str, Any], str]]
    current: str | None


def resolve_path(kubeconfig: str | None = None) -> str:
    """The kubeconfig path (or `:`-list) kubectl would use."""
    if kubeconfig:
        return kubeconfig
    return os.environ.get("KUBECONFIG") or DEFAULT_KUBECONFIG


def _files(path: str) -> list[Path]:
    return [f for p in path.split(os.pathsep) if p and (f := Path(p).expanduser()).is_file()]


def _exists(path: str) -> bool:
    return bool(_files(path))


def _error(message: str) -> KubeconfigError:
    return KubeconfigError(make_status(400, message, "InvalidKubeconfig"))


# The last kubeconfig parsed, by its files' texts: a command reads it for the namespace,
# then for the client; the files are read each time, parsed again only when they differ.
_last: tuple[tuple[str, tuple[tuple[Path, str], ...]], _Merged] | None = None


def _read(path: str) -> _Merged:
    global _last
    texts = []
    for file in _files(path):
        try:
            texts.append((file, file.read_text()))
        except OSError as exc:
            raise _error(f"cannot read kubeconfig {path}: {exc}") from exc
    key = (path, tuple(texts))
    if _last is not None and _last[0] == key:
        return _last[1]
    merged = _parse(path, texts)
    _last = (key, merged)
    return merged


def _parse(path: str, texts: list[tuple[Path, str]]) -> _Merged:
    import yaml

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    merged = _Merged({}, {}, {}, None)
    for file, text in texts:
        try:
            data = yaml.load(text, Loader=loader) or {}
        except yaml.YAMLError as exc:
            raise _error(f"cannot read kubeconfig {path}: {exc}") from exc
        if not isinstance(data, dict):
            raise _error(f"cannot read kubeconfig {path}: {file} is not a kubeconfig")
        base = os.path.abspath(file.parent)
        for kind, key in (("clusters", "cluster"), ("users", "user"), ("contexts", "context")):
            named: dict[str, tuple[dict[str, Any], str]] = getattr(merged, kind)
            for item in data.get(kind) or []:
                if isinstance(item, dict) and item.get("name") is not None:
                    named.setdefault(str(item["name"]), (item.get(key) or {}, base))
        if merged.current is None and data.get("current-context"):
            merged.current = str(data["current-context"])
    return merged


def context_namespace(kubeconfig: str | None = None, context: str | None = None) -> str:
    """The namespace of the context (`default` when it names none, or there is no file)."""
    path = resolve_path(kubeconfig)
    if not _exists(path):
        if kubeconfig or context:
            raise _error(f"kubeconfig {path} not found; pass --kubeconfig or set $KUBECONFIG")
        return "default"
    return _context_entry(path, _read(path), context)[1]


def _context_entry(path: str, merged: _Merged, context: str | None) -> tuple[str, str]:
    name = context or merged.current
    if name is None:
        raise _error(f"{path} has no current-context; pass --context")
    if name not in merged.contexts:
        names = ", ".join(merged.contexts) or "none"
        raise _error(f"context {name!r} not found in {path} (contexts: {names})")
    namespace = merged.contexts[name][0].get("namespace") or "default"
    return name, namespace


def load(kubeconfig: str | None = None, context: str | None = None) -> KubeContext:
    """Resolve the kubeconfig and context into server URL, TLS material and credentials."""
    path = resolve_path(kubeconfig)
    if not _exists(path):
        raise _error(
            f"no kubeconfig at {path}; pass --kubeconfig, set $KUBECONFIG, "
            "or call an agent directly with --agent URL"
        )
    merged = _read(path)
    name, namespace = _context_entry(path, merged, context)
    entry = merged.contexts[name][0]
    user = merged.users.get(str(entry.get("user")), ({}, ""))[0] if entry.get("user") else {}
    if any(key in user for key in _PLUGIN_KEYS):
        cluster = merged.clusters.get(str(entry.get("cluster")), ({}, ""))[0]
        try:  # before the plugin runs: what it yields is a credential too
            refuse_plain_credentials(str(cluster.get("server") or ""), "a plugin's credentials")
        except ValueError as exc:
            raise _error(f"cannot use context {name!r} of {path}: {exc}") from exc
        cfg = _plugin_configuration(path, name)
    else:
        try:
            cfg = _static_configuration(merged, entry)
        except (KeyError, OSError, ValueError) as exc:
            raise _error(f"cannot use context {name!r} of {path}: {exc}") from exc
    return KubeContext(path, name, namespace, cfg.host, cfg)


def _static_configuration(merged: _Merged, entry: dict[str, Any]) -> StaticConfiguration:
    """The official loader's reading of a plugin-free user, without the official loader."""
    cluster_name = str(entry.get("cluster"))
    if cluster_name not in merged.clusters:
        raise KeyError(f"cluster {cluster_name!r} not found")
    cluster, cluster_dir = merged.clusters[cluster_name]
    user, user_dir = merged.users.get(str(entry.get("user")), ({}, cluster_dir))
    server = str(cluster.get("server") or "")
    if not server:
        raise ValueError(f"cluster {cluster_name!r} has no server")
    cfg = StaticConfiguration(host=server.rstrip("/"))
    if urlsplit(cfg.host).scheme == "https":  # the official loader reads TLS material then
        cfg.ca_data = _data(cluster, "certificate-authority")
        cfg.ssl_ca_cert = (
            None if cfg.ca_data else _file(cluster, "certificate-authority", cluster_dir)
        )
        cfg.cert_data = _bytes(_data(user, "client-certificate"))
        cfg.key_data = _bytes(_data(user, "client-key"))
        # Relative to the user's own file, as kubectl has it (each entry's relative
        # paths against the file that defined it; the official Python loader uses the
        # cluster's file, which in a merged list may be another directory).
        cfg.cert_file = None if cfg.cert_data else _file(user, "client-certificate", user_dir)
        cfg.key_file = None if cfg.key_data else _file(user, "client-key", user_dir)
    skip = cluster.get("insecure-skip-tls-verify", False)
    if not isinstance(skip, bool):  # a YAML string "false" is truthy: never guess
        raise ValueError(
            f"cluster {cluster_name!r}: insecure-skip-tls-verify must be true or false "
            f"(a YAML boolean), not {skip!r}"
        )
    cfg.verify_ssl = not skip
    cfg.tls_server_name = cluster.get("tls-server-name")
    cfg.proxy = cluster.get("proxy-url")
    token = user.get("token")
    if not token and user.get("tokenFile"):
        token = Path(_join(user_dir, user["tokenFile"])).read_text().strip()
    if token:
        cfg.authorization = f"Bearer {token}"
    elif "username" in user and "password" in user:
        basic = base64.b64encode(f"{user['username']}:{user['password']}".encode()).decode()
        cfg.authorization = f"Basic {basic}"
    if cfg.authorization:
        refuse_plain_credentials(cfg.host, f"the credentials of cluster {cluster_name!r}")
    return cfg


def _join(base: str, name: str) -> str:
    return os.path.normpath(os.path.join(base, name))


def _data(obj: dict[str, Any], key: str) -> str | None:
    """`<key>-data`: base64 of PEM, preferred over the file, as the official loader has it."""
    value = obj.get(f"{key}-data")
    return base64.standard_b64decode(value).decode() if value else None


def _bytes(text: str | None) -> bytes | None:
    return text.encode() if text is not None else None


def _file(obj: dict[str, Any], key: str, base: str) -> str | None:
    if not obj.get(key):
        return None
    path = _join(base, obj[key])
    if not os.path.isfile(path):
        raise OSError(f"File does not exist: {path}")
    return path


def _plugin_configuration(path: str, name: str) -> Any:
    """The official loader, for users whose credentials come from a plugin."""
    from kubernetes.client import Configuration
    from kubernetes.config import ConfigException, load_kube_config

    cfg = Configuration()
    try:
        load_kube_config(
            config_file=path, context=name, client_configuration=cfg, persist_config=False
        )
    except (ConfigException, OSError, ValueError) as exc:
        raise _error(f"cannot use context {name!r} of {path}: {exc}") from exc
    return cfg


def ssl_context(cfg: Any) -> ssl.SSLContext:
    """Server verification and the client certificate, from either configuration."""
    ca_data = getattr(cfg, "ca_data", None)
    context = ssl.create_default_context(cafile=cfg.ssl_ca_cert or None, cadata=ca_data)
    if not cfg.verify_ssl:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    cert_data, key_data = getattr(cfg, "cert_data", None), getattr(cfg, "key_data", None)
    if cert_data or (key_data and cfg.cert_file):
        cert = cert_data or Path(cfg.cert_file).read_bytes()
        key = key_data or (Path(cfg.key_file).read_bytes() if cfg.key_file else None)
        _load_inline_chain(context, cert, key)
    elif cfg.cert_file:
        context.load_cert_chain(cfg.cert_file, cfg.key_file or None)
    return context


def _load_inline_chain(context: ssl.SSLContext, cert: bytes, key: bytes | None) -> None:
    """`ssl` loads client certificates from files only: a private directory, gone after."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="nvcli-") as tmp:
        paths = []
        for name, content in (("client.crt", cert), ("client.key", key)):
            if content is None:
                continue
            path = os.path.join(tmp, name)
            with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as out:
                out.write(content)
            paths.append(path)
        context.load_cert_chain(*paths)


def authorization(cfg: Any) -> str | None:
    """The `Authorization` header value; the official loader's is refreshed by its hook."""
    if isinstance(cfg, StaticConfiguration):
        return cfg.authorization
    value = cfg.get_api_key_with_prefix("BearerToken", alias="authorization")
    if value:
        return str(value)
    if cfg.username or cfg.password:
        return str(cfg.get_basic_auth_token())
    return None


def aggregated_http_client(
    kube: KubeContext, *, timeout: float | None = DEFAULT_TIMEOUT
) -> HttpClient:
    from cli.transport.connect import http_client

    cfg = kube.configuration
    return http_client(
        kube.server,
        verify=ssl_context(cfg),
        authorization=lambda: authorization(cfg),
        timeout=timeout,
        proxy=cfg.proxy or None,
        server_name=getattr(cfg, "tls_server_name", None),
    )
