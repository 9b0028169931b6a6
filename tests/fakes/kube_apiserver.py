"""A fake kube-apiserver that speaks real HTTP(S), for driving the official client.

What it serves, and why each piece exists (see docs/architecture.md, "The books",
and docs/security.md):

- core/v1 pods (get, list, create, delete), events (create, get, list),
  configmaps (get, list, create) and nodes (get, list): the agent's lookups;
- authentication.k8s.io/v1 TokenReview and authorization.k8s.io/v1
  SubjectAccessReview: the agent's delegated authn/authz, with audiences;
- its own authentication (bearer tokens, TLS client certificates: user = CN,
  groups = O) and authorization from the same rule table (``system:masters``
  may do anything), answering 401/403/404/409 with real ``Status`` bodies;
- a scheduler and kubelet stand-in for holder pods: extended-resource requests
  get device IDs from a per-node pool, recorded in an attached fake PodResources
  server, and are freed on deletion;
- a ResourceQuota on GPU requests (``set_gpu_quota``): a pod that would take its
  namespace past it is refused at creation with the quota plugin's 403 and words;
- resource.k8s.io/v1 (DRA) resourceclaims (get, list, create, delete) and
  resourceslices (get, list; seeded with ``put_resource_slice``): a pod naming claims
  in ``spec.resourceClaims`` is scheduled only where they can be allocated
  (tests/fakes/dra.py), the claims are reserved for it and the node's PodResources
  reports their devices; when the pod is gone they are released and deallocated;
- knobs for attacks: ``stall()`` holds matching requests unanswered (a slow or hung
  API server, on the real wire) until released; ``reviews()`` lists the TokenReview
  and SubjectAccessReview bodies received, to count them or read what was asked;
- legacy discovery (``/api``, ``/api/v1``, ``/apis``, open to every authenticated user as
  kube-apiserver's ``system:discovery`` role makes it) naming what this fake serves, so
  that a real ``kubectl`` finds its way to the aggregated group;
- the aggregated-API front proxy for ``/apis/hotmount.io/``: forwards with
  ``X-Remote-User``/``X-Remote-Group``/``X-Remote-Extra-*`` over TLS presenting a
  front-proxy client certificate, with ``Authorization`` stripped.

Scheduling follows the real split: a pod pinned by ``nodeSelector`` or node
affinity on ``kubernetes.io/hostname`` goes through the scheduler and stays
Pending/Unschedulable when devices are short; a pod with ``spec.nodeName``
bypasses the scheduler, and the kubelet rejects it (phase Failed, reason
``OutOf<resource>``) when devices are short.
"""

from __future__ import annotations

import contextlib
import copy
import datetime
import hashlib
import itertools
import json
import logging
import re
import secrets
import socket
import ssl
import threading
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import parse_qs, quote, unquote, urlsplit

import httpx
import yaml
from kubernetes import client as k8s

from agent.podresources.client import ClaimAllocation
from tests.fakes import dra
from tests.fakes.pki import CertificateAuthority, CertPaths
from tests.fakes.podresources_server import FakePodResourcesServer

log = logging.getLogger(__name__)

Obj = dict[str, Any]
# A pod's claims by spec.resourceClaims entry: (the stored claim, its allocation).
Placement = dict[str, tuple[Obj, Obj]]

API_AUDIENCE = "https://kubernetes.default.svc.cluster.local"
HOSTNAME_LABEL = "kubernetes.io/hostname"
PROXY_GROUP = "hotmount.io"
AUTHENTICATED = "system:authenticated"

# Kinds served from the in-memory store: resource -> (kind, list kind, namespaced).
_CORE: dict[str, tuple[str, str, bool]] = {
    "pods": ("Pod", "PodList", True),
    "events": ("Event", "EventList", True),
    "configmaps": ("ConfigMap", "ConfigMapList", True),
    "nodes": ("Node", "NodeList", False),
}
_CORE_VERBS: dict[str, set[str]] = {
    "pods": {"get", "list", "create", "delete", "patch"},
    "events": {"get", "list", "create"},
    "configmaps": {"get", "list", "create"},
    "nodes": {"get", "list"},
}
DRA_GROUP = "resource.k8s.io"
_JSON = "application/json"
_DRA: dict[str, tuple[str, str, bool]] = {
    "resourceclaims": ("ResourceClaim", "ResourceClaimList", True),
    "resourceslices": ("ResourceSlice", "ResourceSliceList", False),
}
_DRA_VERBS: dict[str, set[str]] = {
    "resourceclaims": {"get", "list", "create", "delete"},
    "resourceslices": {"get", "list"},
}
# Field selectors the real server accepts for each resource.
_FIELDS: dict[str, set[str]] = {
    "pods": {
        "metadata.name",
        "metadata.namespace",
        "spec.nodeName",
        "spec.restartPolicy",
        "spec.schedulerName",
        "spec.serviceAccountName",
        "status.phase",
        "status.podIP",
        "status.nominatedNodeName",
    },
    "events": {
        "metadata.name",
        "metadata.namespace",
        "involvedObject.kind",
        "involvedObject.namespace",
        "involvedObject.name",
        "involvedObject.uid",
        "involvedObject.apiVersion",
        "involvedObject.resourceVersion",
        "involvedObject.fieldPath",
        "reason",
        "reportingComponent",
        "type",
    },
    "configmaps": {"metadata.name", "metadata.namespace"},
    "nodes": {"metadata.name", "spec.unschedulable"},
    "resourceclaims": {"metadata.name", "metadata.namespace"},
    "resourceslices": {"metadata.name", "spec.nodeName", "spec.driver"},
}
# Hop-by-hop headers plus the caller's credentials: never passed to the backend.
_NOT_FORWARDED = {
    "connection",
    "keep-alive",
    "proxy-connection",
    "transfer-encoding",
    "upgrade",
    "te",
    "trailer",
    "host",
    "content-length",
    "authorization",
}


# -- configuration ------------------------------------------------------------


@dataclass(frozen=True)
class TokenInfo:
    """Who a bearer token is and for which audiences it was minted."""

    username: str
    groups: tuple[str, ...] = ()
    audiences: tuple[str, ...] = (API_AUDIENCE,)
    uid: str = ""
    extra: Mapping[str, tuple[str, ...]] = field(default_factory=dict)


@dataclass(frozen=True)
class AccessRule:
    """One grant; set ``user`` or ``group``. Every other field may be ``*``.

    ``resource`` may name a subresource (``pods/log``); for non-resource
    requests it is matched against the URL path.
    """

    user: str | None = None
    group: str | None = None
    verb: str = "*"
    api_group: str = "*"
    resource: str = "*"
    namespace: str = "*"
    name: str = "*"

    def matches(self, req: Attributes) -> bool:
        if self.user is not None and self.user != req.user:
            return False
        if self.group is not None and self.group not in req.groups:
            return False
        if self.user is None and self.group is None:
            return False
        if not req.is_resource:
            return self.verb in ("*", req.verb) and self.resource in ("*", req.path)
        resource = f"{req.resource}/{req.subresource}" if req.subresource else req.resource
        return all(
            want in ("*", have)
            for want, have in (
                (self.verb, req.verb),
                (self.api_group, req.api_group),
                (self.resource, resource),
                (self.namespace, req.namespace),
                (self.name, req.name),
            )
        )


@dataclass(frozen=True)
class Attributes:
    """An authorization question, as kube-apiserver's RequestInfo and a SAR phrase it."""

    user: str
    groups: tuple[str, ...]
    verb: str
    api_group: str = ""
    resource: str = ""
    subresource: str = ""
    namespace: str = ""
    name: str = ""
    is_resource: bool = True
    path: str = ""


@dataclass(frozen=True)
class FrontProxy:
    """How the fake reaches an aggregated API server, as an APIService would say it.

    ``client`` is the front-proxy client certificate (issued by the
    request-header CA; its CN must be in ``allowed_names``); ``backend_ca``
    verifies the backend's serving certificate.
    """

    backend_url: str
    client: CertPaths
    backend_ca: Path
    allowed_names: tuple[str, ...] = ("front-proxy-client",)


class Stall:
    """Requests matching (verb, api_group, resource, name) wait unanswered until `release()`.

    ``arrived`` counts them; ``wait_arrived(n)`` lets a test know that ``n`` callers are
    now stuck, without sleeping.
    """

    def __init__(
        self, verb: str = "*", api_group: str = "", resource: str = "*", name: str = "*"
    ) -> None:
        self.verb, self.api_group, self.resource, self.name = verb, api_group, resource, name
        self.arrived = 0
        self._released = False
        self._cond = threading.Condition()

    def matches(self, req: Attributes) -> bool:
        return (
            req.is_resource
            and self.verb in ("*", req.verb)
            and self.api_group in ("*", req.api_group)
            and self.resource in ("*", req.resource)
            and self.name in ("*", req.name)
        )

    def hold(self) -> None:
        with self._cond:
            self.arrived += 1
            self._cond.notify_all()
            self._cond.wait_for(lambda: self._released)

    def wait_arrived(self, count: int, timeout: float = 30.0) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: self.arrived >= count, timeout)

    def release(self) -> None:
        with self._cond:
            self._released = True
            self._cond.notify_all()


@dataclass(frozen=True)
class User:
    name: str
    groups: tuple[str, ...]
    uid: str = ""
    extra: Mapping[str, tuple[str, ...]] = field(default_factory=dict)


class ApiError(Exception):
    """Becomes a ``Status`` response; carries the body the real server would send."""

    def __init__(self, code: int, reason: str, message: str, details: Obj | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.body: Obj = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": message,
            "reason": reason,
            "code": code,
        }
        if details:
            self.body["details"] = details


def _not_found(resource: str, name: str) -> ApiError:
    return ApiError(
        404, "NotFound", f'{resource} "{name}" not found', {"name": name, "kind": resource}
    )


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _lookup(obj: Obj, dotted: str) -> str:
    value: Any = obj
    for part in dotted.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    if value is None:
        return ""
    return str(value).lower() if isinstance(value, bool) else str(value)


def _match_fields(obj: Obj, selector: str, resource: str) -> bool:
    for term in filter(None, (t.strip() for t in selector.split(","))):
        m = re.fullmatch(r"([^=!]+)(==|=|!=)(.*)", term)
        if not m:
            raise ApiError(400, "BadRequest", f"invalid field selector: {term!r}")
        key, op, value = m.groups()
        if key not in _FIELDS.get(resource, set()):
            raise ApiError(400, "BadRequest", f"field label not supported: {key}")
        if (_lookup(obj, key) == value) != (op != "!="):
            return False
    return True


def _match_labels(labels: Mapping[str, str], selector: str) -> bool:
    for raw_term in re.findall(r"[^,(]+(?:\([^)]*\))?", selector):
        term = raw_term.strip()
        if not term:
            continue
        if m := re.fullmatch(r"([\w./-]+)\s+(in|notin)\s+\(([^)]*)\)", term):
            key, op, values = m.group(1), m.group(2), {v.strip() for v in m.group(3).split(",")}
            if (labels.get(key) in values) != (op == "in"):
                return False
        elif m := re.fullmatch(r"([\w./-]+)\s*(==|=|!=)\s*([\w./-]*)", term):
            key, op, value = m.groups()
            if (labels.get(key) == value) != (op != "!="):
                return False
        elif m := re.fullmatch(r"(!?)([\w./-]+)", term):
            if (m.group(2) in labels) == (m.group(1) == "!"):
                return False
        else:
            raise ApiError(400, "BadRequest", f"unable to parse requirement: {term!r}")
    return True


def _request_info(path: str, method: str, query: Mapping[str, list[str]]) -> tuple[str, Attributes]:
    """Split a URL the way kube-apiserver's RequestInfoFactory does; returns (version, attrs)."""
    parts = [unquote(p) for p in path.split("/") if p]
    version, rest, group = "", [], ""
    resourceful = False
    if parts[:2] == ["api", "v1"]:
        version, rest, resourceful = "v1", parts[2:], True
    elif len(parts) >= 3 and parts[0] == "apis":
        group, version, rest, resourceful = parts[1], parts[2], parts[3:], True
    if not resourceful or not rest:
        verb = {"GET": "get", "POST": "post", "PUT": "put", "DELETE": "delete"}.get(method, "get")
        return version, Attributes("", (), verb, api_group=group, is_resource=False, path=path)
    namespace = ""
    if rest[0] == "namespaces" and len(rest) > 2:
        namespace, rest = rest[1], rest[2:]
    resource = rest[0]
    name = rest[1] if len(rest) > 1 else ""
    subresource = rest[2] if len(rest) > 2 else ""
    if method == "GET":
        watching = query.get("watch", [""])[0] in ("true", "1")
        verb = "get" if name else ("watch" if watching else "list")
    elif method == "DELETE":
        verb = "delete" if name else "deletecollection"
    else:
        verb = {"POST": "create", "PUT": "update", "PATCH": "patch"}.get(method, method.lower())
    return version, Attributes(
        "",
        (),
        verb,
        api_group=group,
        resource=resource,
        subresource=subresource,
        namespace=namespace,
        name=name,
        path=path,
    )


# -- HTTP plumbing ----------------------------------------------------------------


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def setup(self) -> None:
        super().setup()
        if isinstance(self.connection, ssl.SSLSocket):
            self.connection.do_handshake()  # here, not in the accept loop

    def _dispatch(self) -> None:
        self.server.fake._handle(self)

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _dispatch  # noqa: N815

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("fake-apiserver: " + format, *args)


class _Server(ThreadingHTTPServer):
    """Threaded server that can close idle keep-alive connections on stop."""

    daemon_threads = False
    block_on_close = True

    def __init__(self, fake: FakeKubeApiServer, context: ssl.SSLContext | None) -> None:
        self.fake = fake
        self.context = context
        self.open: set[socket.socket] = set()
        self.open_lock = threading.Lock()
        super().__init__(("127.0.0.1", 0), _Handler)

    def get_request(self) -> tuple[socket.socket, Any]:
        sock, addr = super().get_request()
        if self.context is not None:
            sock = self.context.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
        return sock, addr

    def process_request(self, request: Any, client_address: Any) -> None:
        with self.open_lock:
            self.open.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        with self.open_lock:
            self.open.discard(request)
        super().shutdown_request(request)

    def handle_error(self, request: Any, client_address: Any) -> None:
        log.debug("fake-apiserver: connection from %s failed", client_address, exc_info=True)

    def close_connections(self) -> None:
        with self.open_lock:
            conns = list(self.open)
        for conn in conns:
            # The plain-socket shutdown wakes the reader without touching SSL state.
            with contextlib.suppress(OSError):
                socket.socket.shutdown(conn, socket.SHUT_RDWR)


# -- the fake -------------------------------------------------------------------------


class FakeKubeApiServer:
    """In-memory kube-apiserver on 127.0.0.1 (random port), thread-safe, for tests.

    ``nodes`` maps node name to its pool of fake device IDs for ``gpu_resource``.
    ``running_delay`` is how long a scheduled pod stays Pending before Running;
    ``termination_seconds`` how long a gracefully deleted pod lingers (capped
    by its grace period) before it is gone and its devices are free.
    """

    def __init__(
        self,
        *,
        tls: CertPaths | None = None,
        client_ca: Path | None = None,
        admin_token: str = "admin-token",
        tokens: Mapping[str, TokenInfo] | None = None,
        rules: Iterable[AccessRule] = (),
        nodes: Mapping[str, Sequence[str]] | None = None,
        gpu_resource: str = "nvidia.com/gpu",
        running_delay: float = 0.0,
        termination_seconds: float = 0.0,
        podresources: Mapping[str, FakePodResourcesServer] | None = None,
        front_proxy: FrontProxy | None = None,
        api_audiences: Sequence[str] = (API_AUDIENCE,),
        serve_dra: bool = True,
    ) -> None:
        self.tls = tls
        self.serve_dra = serve_dra  # False: a cluster without resource.k8s.io/v1 (404)
        self.client_ca = client_ca
        self.admin_token = admin_token
        self.api_audiences = tuple(api_audiences)
        self.gpu_resource = gpu_resource
        self.running_delay = running_delay
        self.termination_seconds = termination_seconds
        self.ca: CertificateAuthority | None = None  # set by with_tls()
        self._lock = threading.RLock()
        self._tokens: dict[str, TokenInfo] = dict(tokens or {})
        self._tokens[admin_token] = TokenInfo(
            "kubernetes-admin", ("system:masters",), self.api_audiences
        )
        self._rules: list[AccessRule] = [*_PUBLIC_INFO, *rules]
        self._store: dict[str, dict[tuple[str, str], Obj]] = {r: {} for r in [*_CORE, *_DRA]}
        self._pools: dict[str, list[str]] = {n: list(ids) for n, ids in (nodes or {}).items()}
        self._used: dict[str, dict[str, tuple[str, str]]] = {n: {} for n in self._pools}
        self._quotas: dict[str, tuple[str, int]] = {}  # namespace: (quota, hard GPU requests)
        self._podresources: dict[str, FakePodResourcesServer] = {}
        self._rv = itertools.count(1)
        self._ips = itertools.count(2)
        self._timers: list[threading.Timer] = []
        self._stalls: list[Stall] = []
        self._reviews: list[tuple[str, Obj]] = []
        self._requests: list[tuple[str, str]] = []  # (method, path with query), as they came
        self._front_proxy: FrontProxy | None = None
        self._proxy_client: httpx.Client | None = None
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        for node in self._pools:
            self._store["nodes"][("", node)] = self._node_object(node)
        for node, server in (podresources or {}).items():
            self.attach_podresources(node, server)
        self.set_configmap("kube-system", "extension-apiserver-authentication", {})
        if front_proxy is not None:
            self.configure_front_proxy(front_proxy)

    @classmethod
    def with_tls(cls, directory: Path | str, **kwargs: Any) -> FakeKubeApiServer:
        """A TLS server whose cluster CA (``.ca``) also signs accepted client certs."""
        ca = CertificateAuthority(Path(directory), "fake-cluster-ca")
        server = cls(tls=ca.issue_server("kube-apiserver"), client_ca=ca.cert_path, **kwargs)
        server.ca = ca
        server._refresh_authentication_configmap()
        return server

    # -- lifecycle ------------------------------------------------------------------
    def start(self) -> FakeKubeApiServer:
        context = None
        if self.tls is not None:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(self.tls.cert, self.tls.key)
            if self.client_ca is not None:
                context.load_verify_locations(cafile=str(self.client_ca))
                context.verify_mode = ssl.CERT_OPTIONAL
        self._server = _Server(self, context)
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.05},
            name="fake-apiserver",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        with self._lock:
            timers, self._timers = self._timers, []
            stalls, self._stalls = self._stalls, []
        for stall in stalls:  # else stopping would wait on their handler threads
            stall.release()
        for timer in timers:
            timer.cancel()
        for timer in timers:
            if timer is not threading.current_thread():
                timer.join()
        if self._server is not None:
            self._server.shutdown()
            self._server.close_connections()
            self._server.server_close()  # joins the handler threads
            self._server = None
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._proxy_client is not None:
            self._proxy_client.close()
            self._proxy_client = None

    def __enter__(self) -> FakeKubeApiServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    @property
    def url(self) -> str:
        if self._server is None:
            raise RuntimeError("fake API server not started")
        scheme = "https" if self.tls is not None else "http"
        return f"{scheme}://127.0.0.1:{self._server.server_address[1]}"

    @property
    def ca_path(self) -> Path | None:
        """CA that verifies the serving certificate (None over plain HTTP)."""
        return self.tls.ca if self.tls is not None else None

    # -- client helpers ------------------------------------------------------------
    def configuration(
        self, token: str | None = None, cert: CertPaths | None = None
    ) -> k8s.Configuration:
        """Client configuration; the admin token when neither credential is given."""
        cfg = k8s.Configuration(host=self.url)
        if self.ca_path is not None:
            cfg.ssl_ca_cert = str(self.ca_path)
        if cert is not None:
            cfg.cert_file, cfg.key_file = str(cert.cert), str(cert.key)
        else:
            cfg.api_key = {"BearerToken": token if token is not None else self.admin_token}
            cfg.api_key_prefix = {"BearerToken": "Bearer"}
        return cfg

    def api_client(self, token: str | None = None, cert: CertPaths | None = None) -> k8s.ApiClient:
        """An ``ApiClient``; use it in a ``with`` block so its pool is closed."""
        return k8s.ApiClient(self.configuration(token, cert))

    def write_kubeconfig(
        self,
        path: Path | str,
        token: str | None = None,
        cert: CertPaths | None = None,
        namespace: str = "default",
    ) -> Path:
        """A kubeconfig (context ``fake``) with token or client-certificate credentials."""
        cluster: Obj = {"server": self.url}
        if self.ca_path is not None:
            cluster["certificate-authority"] = str(self.ca_path)
        user: Obj
        if cert is not None:
            user = {"client-certificate": str(cert.cert), "client-key": str(cert.key)}
        else:
            user = {"token": token if token is not None else self.admin_token}
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "fake", "cluster": cluster}],
            "users": [{"name": "fake", "user": user}],
            "contexts": [
                {
                    "name": "fake",
                    "context": {"cluster": "fake", "user": "fake", "namespace": namespace},
                }
            ],
            "current-context": "fake",
        }
        path = Path(path)
        path.write_text(yaml.safe_dump(config))
        return path

    # -- state helpers for tests -----------------------------------------------------
    def add_token(
        self,
        token: str,
        username: str,
        groups: Sequence[str] = (),
        *,
        audiences: Sequence[str] | None = None,
        uid: str = "",
        extra: Mapping[str, Sequence[str]] | None = None,
    ) -> None:
        """Register a bearer token; audiences default to the API server's own."""
        info = TokenInfo(
            username,
            tuple(groups),
            tuple(audiences) if audiences is not None else self.api_audiences,
            uid,
            {k: tuple(v) for k, v in (extra or {}).items()},
        )
        with self._lock:
            self._tokens[token] = info

    def token_audiences(self, token: str) -> tuple[str, ...]:
        """The audiences `token` was minted for; () for a token this server never issued."""
        with self._lock:
            info = self._tokens.get(token)
        return info.audiences if info is not None else ()

    def stall(
        self, verb: str = "*", api_group: str = "", resource: str = "*", name: str = "*"
    ) -> Stall:
        """From now on, hold matching requests unanswered until the Stall is released."""
        stall = Stall(verb, api_group, resource, name)
        with self._lock:
            self._stalls.append(stall)
        return stall

    def reviews(self, kind: str) -> list[Obj]:
        """The bodies of the ``TokenReview`` or ``SubjectAccessReview`` requests received."""
        with self._lock:
            return [copy.deepcopy(body) for k, body in self._reviews if k == kind]

    def allow(self, rule: AccessRule) -> None:
        with self._lock:
            self._rules.append(rule)

    def bind_role(
        self,
        role: Obj,
        *,
        user: str | None = None,
        group: str | None = None,
        namespace: str | None = None,
    ) -> None:
        """Bind an rbac.authorization.k8s.io/v1 (Cluster)Role as RBAC does: a RoleBinding
        in ``namespace`` grants its rules there only (never at the cluster scope, nor a
        non-resource URL); with no ``namespace``, a ClusterRoleBinding grants them
        everywhere, cluster scope and non-resource URLs included.
        """
        for rule in role.get("rules") or []:
            if rule.get("nonResourceURLs"):  # cluster-wide only, as RBAC grants them
                urls, verbs = rule["nonResourceURLs"], rule.get("verbs") or []
                for url, verb in itertools.product(urls, verbs):
                    if namespace is None:
                        self.allow(AccessRule(user=user, group=group, verb=verb, resource=url))
                continue
            for api_group, resource, verb, name in itertools.product(
                rule.get("apiGroups") or [""],
                rule.get("resources") or [],
                rule.get("verbs") or [],
                rule.get("resourceNames") or ["*"],
            ):
                self.allow(
                    AccessRule(
                        user=user,
                        group=group,
                        verb=verb,
                        api_group=api_group,
                        resource=resource,
                        namespace=namespace if namespace is not None else "*",
                        name=name,
                    )
                )

    def allow_auth_delegation(self, user: str) -> None:
        """What ``system:auth-delegator`` grants: create TokenReviews and SARs."""
        self.allow(
            AccessRule(
                user=user, verb="create", api_group="authentication.k8s.io", resource="tokenreviews"
            )
        )
        self.allow(
            AccessRule(
                user=user,
                verb="create",
                api_group="authorization.k8s.io",
                resource="subjectaccessreviews",
            )
        )

    def attach_podresources(self, node: str, server: FakePodResourcesServer) -> None:
        """Make ``server`` the kubelet PodResources of ``node`` (allocatable = the pool)."""
        with self._lock:
            self._podresources[node] = server
            server.set_allocatable(self.gpu_resource, self._pools.get(node, []))

    def set_configmap(self, namespace: str, name: str, data: Mapping[str, str]) -> None:
        with self._lock:
            self._store["configmaps"][(namespace, name)] = self._with_metadata(
                {
                    "kind": "ConfigMap",
                    "apiVersion": "v1",
                    "metadata": {"name": name},
                    "data": dict(data),
                },
                namespace,
            )

    def put_pod(self, pod: Obj) -> Obj:
        """Store a pod exactly as given (status included), bypassing scheduling."""
        pod = copy.deepcopy(pod)
        namespace = pod.get("metadata", {}).get("namespace", "default")
        pod.setdefault("kind", "Pod")
        pod.setdefault("apiVersion", "v1")
        with self._lock:
            self._with_metadata(pod, namespace)
            self._store["pods"][(namespace, pod["metadata"]["name"])] = pod
            return copy.deepcopy(pod)

    def set_gpu_quota(self, namespace: str, name: str, hard: int) -> None:
        """A ResourceQuota `name` of `hard` on requests of the GPU resource in `namespace`:
        a pod that would take the namespace past it is refused at creation (403), as the
        quota admission plugin refuses it, counting the pods that are not finished."""
        with self._lock:
            self._quotas[namespace] = (name, hard)

    def _check_quota(self, namespace: str, pod: Obj) -> None:
        if namespace not in self._quotas:
            return
        quota, hard = self._quotas[namespace]
        wanted = sum(self._requested(c) for c in pod.get("spec", {}).get("containers") or [])
        used = sum(
            self._requested(c)
            for (ns, _), other in self._store["pods"].items()
            if ns == namespace
            and (other.get("status") or {}).get("phase") not in ("Failed", "Succeeded")
            for c in other["spec"].get("containers") or []
        )
        if wanted and used + wanted > hard:
            key = f"requests.{self.gpu_resource}"
            raise ApiError(
                403,
                "Forbidden",
                f'pods "{pod["metadata"]["name"]}" is forbidden: exceeded quota: {quota}, '
                f"requested: {key}={wanted}, used: {key}={used}, limited: {key}={hard}",
                {"name": pod["metadata"]["name"], "kind": "pods"},
            )

    def put_node(self, name: str, gpus: int = 0, labels: Mapping[str, str] | None = None) -> None:
        """A node with `gpus` of gpu_resource in its capacity (none in the scheduler's pool)."""
        count = str(gpus)
        node = {
            "kind": "Node",
            "apiVersion": "v1",
            "metadata": {"name": name, "labels": {HOSTNAME_LABEL: name, **(labels or {})}},
            "status": {
                "capacity": {self.gpu_resource: count},
                "allocatable": {self.gpu_resource: count},
            },
        }
        with self._lock:
            self._store["nodes"][("", name)] = self._with_metadata(node, "")

    def requests(self) -> list[tuple[str, str]]:
        """Every request served so far: (method, path with its query)."""
        with self._lock:
            return list(self._requests)

    def pod(self, namespace: str, name: str) -> Obj | None:
        with self._lock:
            return copy.deepcopy(self._store["pods"].get((namespace, name)))

    def pods(self) -> list[Obj]:
        with self._lock:
            return copy.deepcopy(list(self._store["pods"].values()))

    def events(self, namespace: str | None = None) -> list[Obj]:
        """Stored core/v1 events, oldest first."""
        with self._lock:
            return copy.deepcopy(
                [
                    e
                    for (ns, _), e in self._store["events"].items()
                    if namespace is None or ns == namespace
                ]
            )

    def put_resource_slice(self, obj: Obj) -> Obj:
        """Publish a ResourceSlice as a DRA driver's kubelet plugin would; pods waiting for
        devices are scheduled again."""
        obj = copy.deepcopy(obj)
        obj["kind"], obj["apiVersion"] = "ResourceSlice", f"{DRA_GROUP}/v1"
        with self._lock:
            self._with_metadata(obj, "")
            self._store["resourceslices"][("", obj["metadata"]["name"])] = obj
            self._retry_unschedulable()
            return copy.deepcopy(obj)

    def resource_claim(self, namespace: str, name: str) -> Obj | None:
        with self._lock:
            return copy.deepcopy(self._store["resourceclaims"].get((namespace, name)))

    def free_devices(self, node: str) -> list[str]:
        with self._lock:
            return [d for d in self._pools[node] if d not in self._used[node]]

    def configure_front_proxy(self, front_proxy: FrontProxy | None) -> None:
        """Register (or with None, remove) the aggregated ``hotmount.io`` backend."""
        old = self._proxy_client
        client = None
        if front_proxy is not None:
            context = ssl.create_default_context(cafile=str(front_proxy.backend_ca))
            context.load_cert_chain(str(front_proxy.client.cert), str(front_proxy.client.key))
            client = httpx.Client(verify=context, timeout=30.0)
        with self._lock:
            self._front_proxy, self._proxy_client = front_proxy, client
            self._refresh_authentication_configmap()
        if old is not None:
            old.close()

    def _refresh_authentication_configmap(self) -> None:
        """Mirror ``kube-system/extension-apiserver-authentication`` as kube-apiserver writes it."""
        data: dict[str, str] = {}
        if self.client_ca is not None:
            data["client-ca-file"] = Path(self.client_ca).read_text()
        fp = self._front_proxy
        if fp is not None:
            data.update(
                {
                    "requestheader-client-ca-file": fp.client.ca.read_text(),
                    "requestheader-allowed-names": json.dumps(list(fp.allowed_names)),
                    "requestheader-username-headers": json.dumps(["X-Remote-User"]),
                    "requestheader-group-headers": json.dumps(["X-Remote-Group"]),
                    "requestheader-extra-headers-prefix": json.dumps(["X-Remote-Extra-"]),
                }
            )
        self.set_configmap("kube-system", "extension-apiserver-authentication", data)

    # -- request handling ------------------------------------------------------------
    def _handle(self, h: _Handler) -> None:
        with self._lock:
            self._requests.append((h.command, h.path))
        length = int(h.headers.get("Content-Length") or 0)
        raw = h.rfile.read(length) if length else b""
        try:
            code, payload, content_type = self._route(h, raw)
        except ApiError as err:
            code, content_type = err.code, "application/json"
            payload = json.dumps(err.body).encode()
        h.send_response(code)
        h.send_header("Content-Type", content_type)
        h.send_header("Content-Length", str(len(payload)))
        h.end_headers()
        h.wfile.write(payload)

    def _route(self, h: _Handler, raw: bytes) -> tuple[int, bytes, str]:
        url = urlsplit(h.path)
        query = parse_qs(url.query)
        user = self._authenticate(h)
        if user is None:
            raise ApiError(401, "Unauthorized", "Unauthorized")
        version, info = _request_info(url.path, h.command, query)
        req = Attributes(
            user.name,
            user.groups,
            info.verb,
            info.api_group,
            info.resource,
            info.subresource,
            info.namespace,
            info.name,
            info.is_resource,
            info.path,
        )
        if req.api_group == PROXY_GROUP:
            return self._proxy(h, user, req, raw)
        if h.command == "GET" and url.path.rstrip("/") in ("/api", "/api/v1", "/apis"):
            return 200, json.dumps(self._discovery(url.path.rstrip("/"))).encode(), _JSON
        if h.command == "GET" and url.path.rstrip("/") == "/openapi/v3":
            # An OpenAPI v3 index with no documents (no OpenAPI v2 either): kubectl's
            # client-side validation finds no schema, so tests apply with --validate=false.
            return 200, json.dumps({"paths": {}}).encode(), _JSON
        with self._lock:
            stalls = [s for s in self._stalls if s.matches(req)]
        for stall in stalls:
            stall.hold()
        self._authorize_or_raise(req)
        body: Obj = {}
        if raw:
            try:
                body = json.loads(raw)
            except ValueError as err:
                raise ApiError(400, "BadRequest", f"invalid JSON body: {err}") from err
        content_type = h.headers.get("Content-Type", "").split(";")[0].strip()
        code, obj = self._serve(req, version, query, body, content_type)
        return code, json.dumps(obj).encode(), "application/json"

    def _serve(
        self,
        req: Attributes,
        version: str,
        query: Mapping[str, list[str]],
        body: Obj,
        content_type: str = "application/json",
    ) -> tuple[int, Obj]:
        not_found = ApiError(404, "NotFound", "the server could not find the requested resource")
        if not req.is_resource and req.path.rstrip("/") == "/version" and req.verb == "get":
            return 200, _VERSION
        if not req.is_resource or version != "v1" or req.subresource:
            raise not_found
        if req.api_group == "authentication.k8s.io" and req.resource == "tokenreviews":
            if req.verb != "create" or req.name:
                raise _method_not_allowed()
            with self._lock:
                self._reviews.append(("TokenReview", body))
            return 201, self._token_review(body)
        if req.api_group == "authorization.k8s.io" and req.resource == "subjectaccessreviews":
            if req.verb != "create" or req.name:
                raise _method_not_allowed()
            with self._lock:
                self._reviews.append(("SubjectAccessReview", body))
            return 201, self._subject_access_review(body)
        if req.api_group == DRA_GROUP and req.resource in _DRA and self.serve_dra:
            return self._serve_dra(req, query, body)
        if req.api_group != "" or req.resource not in _CORE:
            raise not_found
        if req.verb not in _CORE_VERBS[req.resource]:
            raise _method_not_allowed()
        with self._lock:
            if req.verb == "get":
                return 200, self._get(req.resource, req.namespace, req.name)
            if req.verb == "list":
                return 200, self._list(req.resource, req.namespace, query)
            if req.verb == "create":
                return 201, self._create(req.resource, req.namespace, body)
            if req.verb == "patch":
                return 200, self._merge_patch(
                    req.resource, req.namespace, req.name, body, content_type
                )
            return 200, self._delete_pod(req.namespace, req.name, query, body)

    def _merge_patch(
        self, resource: str, namespace: str, name: str, patch: Obj, content_type: str
    ) -> Obj:
        """A JSON merge patch (RFC 7386) of an object's metadata, as kube-apiserver applies
        one. Strategic merge and JSON patch are not spoken here: refused, not guessed."""
        if content_type != "application/merge-patch+json":
            raise ApiError(
                415,
                "UnsupportedMediaType",
                f"the fake API server applies only merge patches, not {content_type}",
            )
        if set(patch) - {"metadata"}:
            raise ApiError(422, "Invalid", "the fake API server patches metadata only")
        obj = self._store[resource].get((namespace, name))
        if obj is None:
            raise _not_found(resource, name)
        obj["metadata"] = _merged(obj["metadata"], patch.get("metadata") or {})
        obj["metadata"]["resourceVersion"] = str(next(self._rv))
        return copy.deepcopy(obj)

    def _serve_dra(
        self, req: Attributes, query: Mapping[str, list[str]], body: Obj
    ) -> tuple[int, Obj]:
        if req.verb not in _DRA_VERBS[req.resource]:
            raise _method_not_allowed()
        namespace = req.namespace if _DRA[req.resource][2] else ""
        with self._lock:
            if req.verb == "get":
                return 200, self._get(req.resource, namespace, req.name)
            if req.verb == "list":
                return 200, self._list(req.resource, namespace, query)
            if req.verb == "create":
                return 201, self._create(req.resource, namespace, body)
            return 200, self._delete_claim(namespace, req.name)

    # -- authentication and authorization ----------------------------------------------
    def _authenticate(self, h: _Handler) -> User | None:
        """x509 first, then bearer tokens, like kube-apiserver's union authenticator."""
        if isinstance(h.connection, ssl.SSLSocket):
            peer = h.connection.getpeercert()
            if peer:
                names = [attr for rdn in peer.get("subject", ()) for attr in rdn]
                cn = next((v for k, v in names if k == "commonName"), "")
                groups = tuple(v for k, v in names if k == "organizationName")
                if cn:
                    return User(cn, (*groups, AUTHENTICATED))
        auth = h.headers.get("Authorization", "")
        if auth.startswith("Bearer "):
            with self._lock:
                info = self._tokens.get(auth[len("Bearer ") :].strip())
            if info is not None and set(info.audiences) & set(self.api_audiences):
                return User(info.username, (*info.groups, AUTHENTICATED), info.uid, info.extra)
        return None

    def authorize(self, req: Attributes) -> tuple[bool, str]:
        """The rule table's decision and a reason; ``system:masters`` may do anything."""
        if "system:masters" in req.groups:
            return True, 'allowed: member of group "system:masters"'
        with self._lock:
            for rule in self._rules:
                if rule.matches(req):
                    return True, f"allowed by fake rule {rule}"
        return False, "no fake rule allows this request"

    def _authorize_or_raise(self, req: Attributes) -> None:
        allowed, _ = self.authorize(req)
        if allowed:
            return
        if not req.is_resource:
            raise ApiError(
                403,
                "Forbidden",
                f'forbidden: User "{req.user}" cannot {req.verb} path "{req.path}"',
            )
        resource = f"{req.resource}/{req.subresource}" if req.subresource else req.resource
        # kube-apiserver names the GroupResource: `reassignments.hotmount.io "x"`.
        qualified = f"{resource}.{req.api_group}" if req.api_group else resource
        target = f'{qualified} "{req.name}"' if req.name else qualified
        scope = f'in the namespace "{req.namespace}"' if req.namespace else "at the cluster scope"
        raise ApiError(
            403,
            "Forbidden",
            f'{target} is forbidden: User "{req.user}" cannot {req.verb} resource '
            f'"{resource}" in API group "{req.api_group}" {scope}',
            {"name": req.name, "group": req.api_group, "kind": req.resource},
        )

    def _token_review(self, body: Obj) -> Obj:
        spec = body.get("spec") or {}
        requested = list(spec.get("audiences") or self.api_audiences)
        with self._lock:
            info = self._tokens.get(spec.get("token") or "")
        status: Obj = {"authenticated": False, "user": {}}
        if info is None:
            status["error"] = "invalid bearer token"
        else:
            matched = [a for a in requested if a in info.audiences]
            if not matched:
                status["error"] = (
                    f"token audiences {list(info.audiences)} is invalid "
                    f"for the target audiences {requested}"
                )
            else:
                user: Obj = {
                    "username": info.username,
                    "uid": info.uid,
                    "groups": [*info.groups, AUTHENTICATED],
                }
                if info.extra:
                    user["extra"] = {k: list(v) for k, v in info.extra.items()}
                status = {"authenticated": True, "user": user, "audiences": matched}
        return {
            "kind": "TokenReview",
            "apiVersion": "authentication.k8s.io/v1",
            "metadata": {"creationTimestamp": None},
            "spec": spec,
            "status": status,
        }

    def _subject_access_review(self, body: Obj) -> Obj:
        spec = body.get("spec") or {}
        resource_attrs = spec.get("resourceAttributes")
        non_resource = spec.get("nonResourceAttributes")
        if not (spec.get("user") or spec.get("groups")) or not (resource_attrs or non_resource):
            raise ApiError(
                422,
                "Invalid",
                'SubjectAccessReview.authorization.k8s.io "" is invalid: spec: Invalid value: '
                "user or groups and resourceAttributes or nonResourceAttributes are required",
            )
        user, groups = spec.get("user", ""), tuple(spec.get("groups") or ())
        if resource_attrs:
            ra = resource_attrs
            req = Attributes(
                user,
                groups,
                ra.get("verb", ""),
                ra.get("group", ""),
                ra.get("resource", ""),
                ra.get("subresource", ""),
                ra.get("namespace", ""),
                ra.get("name", ""),
            )
        else:
            req = Attributes(
                user,
                groups,
                non_resource.get("verb", ""),
                is_resource=False,
                path=non_resource.get("path", ""),
            )
        allowed, reason = self.authorize(req)
        return {
            "kind": "SubjectAccessReview",
            "apiVersion": "authorization.k8s.io/v1",
            "metadata": {"creationTimestamp": None},
            "spec": spec,
            "status": {"allowed": allowed, "reason": reason},
        }

    # -- discovery ----------------------------------------------------------------------------
    def _discovery(self, path: str) -> Obj:
        """The legacy discovery documents (kubectl falls back to them from aggregated
        discovery): core v1's resources and the aggregated group, what kubectl needs to
        reach it. The other groups are left out: their version documents are not served."""
        if path == "/api":
            return {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []}
        if path == "/api/v1":
            return {
                "kind": "APIResourceList",
                "groupVersion": "v1",
                "resources": [
                    {"name": name, "singularName": "", "namespaced": namespaced, "kind": kind,
                     "verbs": sorted(_CORE_VERBS[name])}
                    for name, (kind, _, namespaced) in _CORE.items()
                ],
            }  # fmt: skip
        with self._lock:
            proxied = self._front_proxy is not None
        gv = {"groupVersion": f"{PROXY_GROUP}/v1alpha1", "version": "v1alpha1"}
        group = {"name": PROXY_GROUP, "versions": [gv], "preferredVersion": gv}
        return {"kind": "APIGroupList", "apiVersion": "v1", "groups": [group] if proxied else []}

    # -- aggregated API front proxy ---------------------------------------------------------
    def _proxy(
        self, h: _Handler, user: User, req: Attributes, raw: bytes
    ) -> tuple[int, bytes, str]:
        with self._lock:
            front_proxy, client = self._front_proxy, self._proxy_client
        if front_proxy is None or client is None:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        if req.is_resource:  # discovery documents are open to every authenticated user
            self._authorize_or_raise(req)
        headers = [
            (k, v)
            for k, v in h.headers.items()
            if k.lower() not in _NOT_FORWARDED and not k.lower().startswith("x-remote-")
        ]
        headers.append(("X-Remote-User", user.name))
        headers.extend(("X-Remote-Group", g) for g in user.groups)
        for key, values in user.extra.items():
            headers.extend((f"X-Remote-Extra-{quote(key, safe='')}", v) for v in values)
        target = front_proxy.backend_url.rstrip("/") + h.path
        try:
            response = client.request(h.command, target, headers=headers, content=raw)
        except httpx.HTTPError as err:
            raise ApiError(
                503, "ServiceUnavailable", f"error trying to reach service: {err}"
            ) from err
        return (
            response.status_code,
            response.content,
            response.headers.get("Content-Type", "application/json"),
        )

    # -- the object store ------------------------------------------------------------------
    def _with_metadata(self, obj: Obj, namespace: str) -> Obj:
        meta = obj.setdefault("metadata", {})
        if namespace:
            meta["namespace"] = namespace
        meta.setdefault("uid", str(uuid.uuid4()))
        meta.setdefault("creationTimestamp", _now())
        meta["resourceVersion"] = str(next(self._rv))
        return obj

    def _get(self, resource: str, namespace: str, name: str) -> Obj:
        obj = self._store[resource].get((namespace, name))
        if obj is None:
            raise _not_found(resource, name)
        return copy.deepcopy(obj)

    def _list(self, resource: str, namespace: str, query: Mapping[str, list[str]]) -> Obj:
        fields = query.get("fieldSelector", [""])[0]
        labels = query.get("labelSelector", [""])[0]
        items = [
            {k: v for k, v in obj.items() if k not in ("kind", "apiVersion")}
            for (ns, _), obj in self._store[resource].items()
            if (not namespace or ns == namespace)
            and _match_fields(obj, fields, resource)
            and _match_labels(obj.get("metadata", {}).get("labels") or {}, labels)
        ]
        return {
            "kind": _kind(resource)[1],
            "apiVersion": _api_version(resource),
            "metadata": {"resourceVersion": str(next(self._rv))},
            "items": copy.deepcopy(items),
        }

    def _create(self, resource: str, namespace: str, body: Obj) -> Obj:
        kind = _kind(resource)[0]
        obj = copy.deepcopy(body)
        meta = obj.setdefault("metadata", {})
        if meta.get("namespace") and meta["namespace"] != namespace:
            raise ApiError(
                400,
                "BadRequest",
                "the namespace of the provided object does not "
                "match the namespace sent on the request",
            )
        if not meta.get("name"):
            if not meta.get("generateName"):
                raise ApiError(
                    422,
                    "Invalid",
                    f'{kind} "" is invalid: metadata.name: Required '
                    "value: name or generateName is required",
                    {"kind": kind, "causes": [{"field": "metadata.name"}]},
                )
            meta["name"] = meta["generateName"] + secrets.token_hex(3)[:5]
        name = meta["name"]
        if (namespace, name) in self._store[resource]:
            raise ApiError(
                409,
                "AlreadyExists",
                f'{resource} "{name}" already exists',
                {"name": name, "kind": resource},
            )
        if resource == "resourceclaims":
            obj.pop("status", None)  # a subresource: not written on create
            problem = dra.invalid(obj)
            if problem:
                raise ApiError(
                    422,
                    "Invalid",
                    f'{kind}.{DRA_GROUP} "{name}" is invalid: {problem}',
                    {"name": name, "group": DRA_GROUP, "kind": kind},
                )
        if resource == "pods":
            self._check_quota(namespace, obj)
        obj["kind"], obj["apiVersion"] = kind, _api_version(resource)
        self._with_metadata(obj, namespace)
        self._store[resource][(namespace, name)] = obj
        if resource == "pods":
            self._admit_pod(obj)
        elif resource == "resourceclaims":
            self._retry_unschedulable()
        return copy.deepcopy(obj)

    # -- scheduler and kubelet stand-in ------------------------------------------------------
    def _node_object(self, node: str) -> Obj:
        count = str(len(self._pools[node]))
        return self._with_metadata(
            {
                "kind": "Node",
                "apiVersion": "v1",
                "metadata": {"name": node, "labels": {HOSTNAME_LABEL: node}},
                "status": {
                    "capacity": {self.gpu_resource: count},
                    "allocatable": {self.gpu_resource: count},
                },
            },
            "",
        )

    def _requested(self, container: Obj) -> int:
        resources = container.get("resources") or {}
        value = (resources.get("limits") or {}).get(self.gpu_resource)
        if value is None:
            value = (resources.get("requests") or {}).get(self.gpu_resource, 0)
        return int(value)

    def _admit_pod(self, pod: Obj) -> None:
        spec, status = pod.setdefault("spec", {}), pod.setdefault("status", {})
        spec.setdefault("restartPolicy", "Always")
        spec.setdefault("terminationGracePeriodSeconds", 30)
        spec.setdefault("schedulerName", "default-scheduler")
        status.update({"phase": "Pending", "qosClass": "BestEffort"})
        self._schedule(pod)

    def _schedule(self, pod: Obj) -> None:
        spec, status = pod["spec"], pod["status"]
        wanted = sum(self._requested(c) for c in spec.get("containers") or [])
        node = spec.get("nodeName")
        claims = self._pod_claims(pod)
        if isinstance(claims, str):  # a claim is missing: the scheduler waits for it
            if not node:
                self._unschedulable(pod, claims)
            return
        if node:  # bound already: the scheduler is bypassed, the kubelet admits or rejects
            if node not in self._pools:
                return  # no such kubelet: Pending forever, as in a real cluster
            free = len(self._pools[node]) - len(self._used[node])
            if wanted > free:
                status.update(
                    {
                        "phase": "Failed",
                        "reason": f"OutOf{self.gpu_resource}",
                        "message": (
                            "Pod was rejected: Node didn't have enough resource: "
                            f"{self.gpu_resource}, requested: {wanted}, "
                            f"used: {len(self._used[node])}, capacity: {len(self._pools[node])}"
                        ),
                    }
                )
                return
            placement = self._allocate(claims, node)
            if placement is None:  # the kubelet cannot prepare unallocated claims: Pending
                return
            self._bind(pod, node, placement)
            return
        pinned = _pinned_hosts(spec)
        candidates = [n for n in self._pools if pinned is None or n in pinned]
        roomy = [n for n in candidates if len(self._pools[n]) - len(self._used[n]) >= wanted]
        placements = {n: self._allocate(claims, n) for n in roomy}
        fitting = [n for n in roomy if placements[n] is not None]
        if fitting:
            spec["nodeName"] = fitting[0]
            self._bind(pod, fitting[0], placements[fitting[0]])
            return
        total = len(self._pools)
        reasons = []
        if len(candidates) - len(roomy):
            reasons.append(f"{len(candidates) - len(roomy)} Insufficient {self.gpu_resource}")
        if roomy:
            reasons.append(f"{len(roomy)} {dra.CANNOT_ALLOCATE}")
        if total - len(candidates):
            reasons.append(
                f"{total - len(candidates)} node(s) didn't match Pod's node affinity/selector"
            )
        message = (
            f"0/{total} nodes are available: {', '.join(reasons)}."
            if total
            else "no nodes available to schedule pods"
        )
        self._unschedulable(pod, message)

    def _unschedulable(self, pod: Obj, message: str) -> None:
        pod["status"]["conditions"] = [
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "message": message,
                "lastProbeTime": None,
                "lastTransitionTime": _now(),
            }
        ]

    # -- DRA: claims are allocated with the pod's node and released with the pod --------
    def _pod_claims(self, pod: Obj) -> dict[str, Obj] | str:
        """The pod's ResourceClaims by ``spec.resourceClaims`` entry name, or why not yet."""
        namespace = pod["metadata"]["namespace"]
        found: dict[str, Obj] = {}
        for entry in pod["spec"].get("resourceClaims") or []:
            name = entry.get("resourceClaimName")
            if name is None:  # a template's claim comes from a controller the fake lacks
                return "waiting for dynamic resource controller to create the resourceclaim"
            claim = self._store["resourceclaims"].get((namespace, name))
            if claim is None:
                return f'resourceclaim.{DRA_GROUP} "{name}" not found'
            if "deletionTimestamp" in claim["metadata"]:
                return f'resourceclaim "{name}" is being deleted'
            found[entry["name"]] = claim
        return found

    def _allocate(self, claims: dict[str, Obj], node: str) -> Placement | None:
        """Each of a pod's claims with its ``status.allocation`` on ``node``, or None."""
        if not claims:
            return {}
        devices = dra.devices_on(self._store["resourceslices"].values(), node)
        taken = dra.held(self._store["resourceclaims"].values())
        placement: Placement = {}
        for ref, claim in claims.items():
            allocation = dra.allocate(claim, node, devices, taken)
            if allocation is None:
                return None
            placement[ref] = (claim, allocation)
            taken |= {(r["driver"], r["pool"], r["device"]) for r in dra.results(allocation)}
        return placement

    def _reserve_claims(self, pod: Obj, node: str, placement: Placement) -> None:
        """Write each claim's allocation and reservation, then report its devices in the
        node's PodResources for the containers that name it."""
        meta = pod["metadata"]
        claims = {ref: claim for ref, (claim, _) in placement.items()}
        for claim, allocation in placement.values():
            status = claim.setdefault("status", {})
            status["allocation"] = allocation
            finalizers = claim["metadata"].setdefault("finalizers", [])
            if dra.FINALIZER not in finalizers:
                finalizers.append(dra.FINALIZER)
            status.setdefault("reservedFor", []).append(
                {"resource": "pods", "name": meta["name"], "uid": meta["uid"]}
            )
            claim["metadata"]["resourceVersion"] = str(next(self._rv))
        kubelet = self._podresources.get(node)
        if kubelet is None:
            return
        for container in pod["spec"].get("containers") or []:
            for use in (container.get("resources") or {}).get("claims") or []:
                claim = claims.get(use.get("name", ""))
                if claim is None:
                    continue
                for result in dra.results(claim["status"]["allocation"]):
                    if use.get("request") not in (None, result["request"]):
                        continue
                    kubelet.set_claim_allocation(
                        meta["namespace"],
                        meta["name"],
                        container["name"],
                        ClaimAllocation(
                            namespace=meta["namespace"],
                            claim=claim["metadata"]["name"],
                            driver=result["driver"],
                            pool=result["pool"],
                            device=result["device"],
                            cdi_devices=(dra.cdi_name(claim, result),),
                        ),
                    )

    def _release_claims(self, pod: Obj) -> None:
        """Unreserve the pod's claims; one no pod reserves is deallocated (and, if it was
        deleted meanwhile, removed), as the resourceclaim controller does."""
        namespace, uid = pod["metadata"]["namespace"], pod["metadata"]["uid"]
        for key, claim in list(self._store["resourceclaims"].items()):
            status = claim.get("status") or {}
            reserved = status.get("reservedFor") or []
            if key[0] != namespace or not any(r.get("uid") == uid for r in reserved):
                continue
            status["reservedFor"] = [r for r in reserved if r.get("uid") != uid]
            if not status["reservedFor"]:
                claim["status"] = {}
                finalizers = claim["metadata"].get("finalizers") or []
                claim["metadata"]["finalizers"] = [f for f in finalizers if f != dra.FINALIZER]
                if "deletionTimestamp" in claim["metadata"]:
                    del self._store["resourceclaims"][key]
                    continue
            claim["metadata"]["resourceVersion"] = str(next(self._rv))

    def _delete_claim(self, namespace: str, name: str) -> Obj:
        """A claim still reserved by a pod stays, marked for deletion, until the pod is gone."""
        claim = self._store["resourceclaims"].get((namespace, name))
        if claim is None:
            raise _not_found("resourceclaims", name)
        if (claim.get("status") or {}).get("reservedFor"):
            meta = claim["metadata"]
            if "deletionTimestamp" not in meta:
                meta["deletionTimestamp"] = _now()
                meta["deletionGracePeriodSeconds"] = 0
                meta["resourceVersion"] = str(next(self._rv))
            return copy.deepcopy(claim)
        del self._store["resourceclaims"][(namespace, name)]
        return copy.deepcopy(claim)

    def _retry_unschedulable(self) -> None:
        """The scheduler retries unschedulable pods when capacity or claims appear."""
        for waiting in list(self._store["pods"].values()):
            conditions = waiting["status"].get("conditions") or []
            if not waiting["spec"].get("nodeName") and any(
                c.get("reason") == "Unschedulable" for c in conditions
            ):
                self._schedule(waiting)

    def _bind(self, pod: Obj, node: str, placement: Placement | None = None) -> None:
        meta, spec, status = pod["metadata"], pod["spec"], pod["status"]
        key = (meta["namespace"], meta["name"])
        free = [d for d in self._pools[node] if d not in self._used[node]]
        kubelet = self._podresources.get(node)
        for container in spec.get("containers") or []:
            count = self._requested(container)
            if not count:
                continue
            devices, free = free[:count], free[count:]
            for device in devices:
                self._used[node][device] = key
            if kubelet is not None:
                kubelet.set_allocation(
                    key[0], key[1], container["name"], self.gpu_resource, devices
                )
        if placement:
            self._reserve_claims(pod, node, placement)
        status["conditions"] = [
            {
                "type": "PodScheduled",
                "status": "True",
                "lastProbeTime": None,
                "lastTransitionTime": _now(),
            }
        ]
        status["hostIP"] = "192.168.0.10"
        self._later(self.running_delay, lambda: self._run(key, meta["uid"]))

    def _run(self, key: tuple[str, str], uid: str) -> None:
        pod = self._store["pods"].get(key)
        if pod is None or pod["metadata"]["uid"] != uid or pod["status"]["phase"] != "Pending":
            return
        now = _now()
        ip = f"10.244.0.{next(self._ips) % 250 + 2}"
        pod["status"].update(
            {
                "phase": "Running",
                "podIP": ip,
                "podIPs": [{"ip": ip}],
                "startTime": now,
                "conditions": [
                    {"type": t, "status": "True", "lastProbeTime": None, "lastTransitionTime": now}
                    for t in ("Initialized", "Ready", "ContainersReady", "PodScheduled")
                ],
                "containerStatuses": [
                    {
                        "name": c["name"],
                        "image": c.get("image", ""),
                        "imageID": f"docker.io/library/{c.get('image', 'none')}@sha256:" + "0" * 64,
                        "containerID": "containerd://"
                        + hashlib.sha256(f"{uid}/{c['name']}".encode()).hexdigest(),
                        "ready": True,
                        "started": True,
                        "restartCount": 0,
                        "state": {"running": {"startedAt": now}},
                    }
                    for c in pod["spec"].get("containers") or []
                ],
            }
        )
        pod["metadata"]["resourceVersion"] = str(next(self._rv))

    def _delete_pod(
        self, namespace: str, name: str, query: Mapping[str, list[str]], body: Obj
    ) -> Obj:
        pod = self._store["pods"].get((namespace, name))
        if pod is None:
            raise _not_found("pods", name)
        grace = body.get("gracePeriodSeconds")
        if "gracePeriodSeconds" in query:
            grace = int(query["gracePeriodSeconds"][0])
        if grace is None:
            grace = int(pod["spec"].get("terminationGracePeriodSeconds", 30))
        node = pod["spec"].get("nodeName")
        terminal = pod["status"].get("phase") in ("Failed", "Succeeded")
        if grace <= 0 or terminal or node not in self._pools:
            # As the real registry does: unbound, finished or forced pods go at once.
            self._remove_pod(namespace, name, pod["metadata"]["uid"])
            return copy.deepcopy(pod)
        meta = pod["metadata"]
        if "deletionTimestamp" not in meta:
            deadline = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=grace)
            meta["deletionTimestamp"] = deadline.strftime("%Y-%m-%dT%H:%M:%SZ")
            meta["deletionGracePeriodSeconds"] = grace
            meta["resourceVersion"] = str(next(self._rv))
            uid = meta["uid"]
            self._later(
                min(grace, self.termination_seconds), lambda: self._remove_pod(namespace, name, uid)
            )
        return copy.deepcopy(pod)

    def _remove_pod(self, namespace: str, name: str, uid: str) -> None:
        pod = self._store["pods"].get((namespace, name))
        if pod is None or pod["metadata"]["uid"] != uid:
            return
        del self._store["pods"][(namespace, name)]
        node = pod["spec"].get("nodeName")
        if node in self._used:
            self._used[node] = {
                d: owner for d, owner in self._used[node].items() if owner != (namespace, name)
            }
            if node in self._podresources:
                self._podresources[node].remove_pod(namespace, name)
        self._release_claims(pod)
        self._retry_unschedulable()

    def _later(self, delay: float, action: Callable[[], None]) -> None:
        """Run ``action`` under the lock now (delay 0) or from a timer."""
        if delay <= 0:
            action()
            return

        def fire() -> None:
            with self._lock:
                if timer in self._timers:
                    self._timers.remove(timer)
                    action()

        timer = threading.Timer(delay, fire)
        timer.daemon = True
        self._timers.append(timer)
        timer.start()


def _kind(resource: str) -> tuple[str, str, bool]:
    """(kind, list kind, namespaced) of a served resource."""
    return _CORE.get(resource) or _DRA[resource]


def _api_version(resource: str) -> str:
    return f"{DRA_GROUP}/v1" if resource in _DRA else "v1"


def _merged(target: Obj, patch: Obj) -> Obj:
    """RFC 7386: maps merge key by key, null deletes, anything else (lists too) replaces."""
    out = dict(target)
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merged(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def _pinned_hosts(spec: Obj) -> set[str] | None:
    """Nodes a pod is confined to by nodeSelector or required node affinity."""
    hosts: set[str] | None = None
    selected = (spec.get("nodeSelector") or {}).get(HOSTNAME_LABEL)
    if selected is not None:
        hosts = {selected}
    required = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    ) or {}
    allowed: set[str] = set()
    for term in required.get("nodeSelectorTerms") or []:  # terms are ORed
        for expr in term.get("matchExpressions") or []:
            if expr.get("key") == HOSTNAME_LABEL and expr.get("operator") == "In":
                allowed |= set(expr.get("values") or [])
        for expr in term.get("matchFields") or []:  # the node's own name (hostnames agree here)
            if expr.get("key") == "metadata.name" and expr.get("operator") == "In":
                allowed |= set(expr.get("values") or [])
    if allowed:
        hosts = allowed if hosts is None else hosts & allowed
    return hosts


_VERSION: Obj = {  # version.Info: every field, as kube-apiserver answers /version
    "major": "1",
    "minor": "30",
    "gitVersion": "v1.30.0-fake",
    "gitCommit": "0000000000000000000000000000000000000000",
    "gitTreeState": "clean",
    "buildDate": "2026-01-01T00:00:00Z",
    "goVersion": "go1.22.0",
    "compiler": "gc",
    "platform": "linux/amd64",
}
# RBAC's bootstrap ClusterRole system:public-info-viewer, bound to every caller.
_PUBLIC_INFO = tuple(
    AccessRule(group=group, verb="get", resource=path)
    for group in (AUTHENTICATED, "system:unauthenticated")
    for path in ("/healthz", "/livez", "/readyz", "/version", "/version/")
)


def _method_not_allowed() -> ApiError:
    return ApiError(
        405, "MethodNotAllowed", "the server does not allow this method on the requested resource"
    )
