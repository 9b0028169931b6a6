"""A stand-in agent for nvcli's tests: docs/api.md's two faces over real HTTP(S).

It answers from a two-GPU node with canned results shaped by `hotmount.wire.schemas`,
validates every request body against those models (422 `Invalid` otherwise),
and records what it received (path, query, body, headers, the TLS peer's CN)
so tests can check what nvcli sent. `fail(...)` makes matching requests answer
a `Status`; `delay` holds every answer back (for timeouts). Pods have the
containers `main` and `side` (`"*"` means both); a mount with `shareWith` is
remembered, so the pod's status then shows the other holder.

Direct REST (`/v1`) demands `Authorization: Bearer <token>` when `token` is set.
The aggregated face demands `X-Remote-User` and, when `client_ca` is set, a
client certificate whose CN is `front-proxy-client` (as the real agent checks
the API server's front-proxy certificate).
"""

from __future__ import annotations

import hashlib
import json
import re
import ssl
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from pydantic import ValidationError

from hotmount.wire.schemas import MountRequest, ReassignRequest
from tests.fakes.pki import CertPaths

NODE = "node-a"
GPUS = [
    {"index": 0, "uuid": "GPU-aaaaaaaa-0000-0000-0000-000000000000", "minor": 0},
    {"index": 1, "uuid": "GPU-aaaaaaaa-0000-0000-0000-000000000001", "minor": 1},
]
CONTAINER_ID = "c" * 64
POD_CONTAINERS = ["main", "side"]
PREFIX = "/apis/hotmount.io/v1alpha1"


def _gpu(ref: str) -> dict[str, Any] | None:
    for gpu in GPUS:
        names = {str(gpu["index"]), gpu["uuid"], f"nvidia.com/gpu={gpu['index']}"}
        if ref in names:
            return gpu
    return None


def _mounted(gpu: dict[str, Any]) -> dict[str, Any]:
    return {
        "key": gpu["uuid"],
        "kind": "gpu",
        "index": gpu["index"],
        "uuid": gpu["uuid"],
        "paths": [f"/dev/nvidia{gpu['minor']}", "/dev/nvidiactl"],
    }


def container_id(name: str | None) -> str:
    """`main` (the default) is CONTAINER_ID; any other name gets its own ID."""
    if name in (None, "main"):
        return CONTAINER_ID
    return hashlib.sha256(str(name).encode()).hexdigest()


def status(code: int, reason: str, message: str, details: dict[str, Any] | None = None) -> dict:
    body: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "reason": reason,
        "message": message,
        "code": code,
    }
    if details is not None:
        body["details"] = details
    return body


class _Answer(Exception):
    def __init__(self, code: int, body: Any) -> None:
        super().__init__(code)
        self.code, self.body = code, body


@dataclass
class Failure:
    code: int
    body: dict[str, Any]
    method: str | None = None
    path_contains: str = ""


@dataclass
class Received:
    method: str
    path: str
    query: dict[str, list[str]]
    body: Any
    headers: dict[str, list[str]]
    peer_cn: str | None = None

    def header(self, name: str) -> str | None:
        values = self.headers.get(name.lower())
        return values[0] if values else None


@dataclass
class StubAgent:
    tls: CertPaths | None = None
    client_ca: Path | None = None
    token: str | None = None
    delay: float = 0.0
    received: list[Received] = field(default_factory=list)
    failures: list[Failure] = field(default_factory=list)
    shares: dict[tuple[str | None, str | None], str] = field(default_factory=dict)
    # (namespace, pod) -> the mount's `reclaimInSeconds` (it was warned, GPUIdleSoon)
    warned: dict[tuple[str | None, str | None], int] = field(default_factory=dict)
    # (namespace, pod) -> more fields of its device, over the rest (`idlePolicy`, `state`)
    device_fields: dict[tuple[str | None, str | None], dict[str, Any]] = field(default_factory=dict)
    # The list's `metadata.missingNodes`, as a fanning-out agent would name them.
    missing_nodes: list[dict[str, str]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle
    def __enter__(self) -> StubAgent:
        stub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _any(self) -> None:
                stub._handle(self)

            do_GET = do_POST = do_DELETE = _any  # noqa: N815

            def log_message(self, format: str, *args: Any) -> None:
                pass

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        server.daemon_threads = True
        if self.tls is not None:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(self.tls.cert, self.tls.key)
            if self.client_ca is not None:
                context.load_verify_locations(cafile=str(self.client_ca))
                context.verify_mode = ssl.CERT_OPTIONAL
            server.socket = context.wrap_socket(server.socket, server_side=True)
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._server is not None and self._thread is not None
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()

    @property
    def url(self) -> str:
        assert self._server is not None
        scheme = "https" if self.tls is not None else "http"
        return f"{scheme}://127.0.0.1:{self._server.server_address[1]}"

    def fail(
        self,
        code: int,
        reason: str,
        message: str,
        details: dict[str, Any] | None = None,
        *,
        method: str | None = None,
        path_contains: str = "",
    ) -> None:
        self.failures.append(
            Failure(code, status(code, reason, message, details), method, path_contains)
        )

    # -- handling
    def _handle(self, h: BaseHTTPRequestHandler) -> None:
        url = urlsplit(h.path)
        length = int(h.headers.get("Content-Length") or 0)
        raw = h.rfile.read(length) if length else b""
        headers: dict[str, list[str]] = {}
        for key, value in h.headers.items():
            headers.setdefault(key.lower(), []).append(value)
        peer_cn = None
        if isinstance(h.connection, ssl.SSLSocket) and (peer := h.connection.getpeercert()):
            names = [attr for rdn in peer.get("subject", ()) for attr in rdn]
            peer_cn = next((v for k, v in names if k == "commonName"), None)
        body = json.loads(raw) if raw else None
        record = Received(h.command, url.path, parse_qs(url.query), body, headers, peer_cn)
        self.received.append(record)
        if self.delay:
            time.sleep(self.delay)
        try:
            code, answer = self._route(record)
        except _Answer as ans:
            code, answer = ans.code, ans.body
        payload = json.dumps(answer).encode()
        h.send_response(code)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(payload)))
        h.end_headers()
        h.wfile.write(payload)

    def _route(self, req: Received) -> tuple[int, Any]:
        aggregated = req.path.startswith("/apis/")
        if aggregated:
            if self.client_ca is not None and req.peer_cn != "front-proxy-client":
                raise _Answer(401, status(401, "Unauthorized", "no front-proxy certificate"))
            if not req.header("x-remote-user"):
                raise _Answer(401, status(401, "Unauthorized", "Unauthorized"))
        elif self.token is not None and req.header("authorization") != f"Bearer {self.token}":
            raise _Answer(401, status(401, "Unauthorized", "invalid bearer token"))
        for failure in self.failures:
            if failure.method in (None, req.method) and failure.path_contains in req.path:
                raise _Answer(failure.code, failure.body)
        parts = [unquote(p) for p in req.path.split("/") if p]
        return self._aggregated(req, parts[3:]) if aggregated else self._rest(req, parts[1:])

    # -- the /v1 face
    def _rest(self, req: Received, p: list[str]) -> tuple[int, Any]:
        m = req.method
        if p == ["devices"] and m == "GET":
            return 200, self._devices()
        if p == ["reassign"] and m == "POST":
            return 200, self._reassign(req.body)
        if len(p) >= 5 and p[0] == "namespaces" and p[2] == "pods" and p[4] == "devices":
            ns, pod = p[1], p[3]
            if m == "GET" and len(p) == 5:
                return 200, self._pod_devices(ns, pod)
            if m == "POST" and len(p) == 5:
                return 200, self._mount(ns, pod, req.body)
            if m == "DELETE" and len(p) == 6:
                return 200, self._unmount(ns, pod, [p[5]], req.query)
        if len(p) >= 3 and p[0] == "containers" and p[2] == "devices":
            if m == "GET" and len(p) == 3:
                return 200, self._pod_devices(None, None)
            if m == "POST" and len(p) == 3:
                return 200, self._mount(None, None, req.body)
            if m == "DELETE" and len(p) == 4:
                return 200, self._unmount(None, None, [p[3]], req.query)
        raise _Answer(404, status(404, "NotFound", f"no route {m} {req.path}"))

    # -- the hotmount.io/v1alpha1 face
    def _aggregated(self, req: Received, p: list[str]) -> tuple[int, Any]:
        m, api = req.method, "hotmount.io/v1alpha1"
        if not p and m == "GET":
            return 200, {"kind": "APIResourceList", "groupVersion": api, "resources": []}
        if p == ["nodedevices"] and m == "GET":
            item = {"metadata": {"name": NODE}, "status": self._devices()}
            metadata = {"missingNodes": self.missing_nodes} if self.missing_nodes else {}
            listed = {"kind": "NodeDevicesList", "apiVersion": api, "metadata": metadata}
            return 200, {**listed, "items": [item]}
        if len(p) == 2 and p[0] == "nodedevices" and m == "GET":
            if p[1] != NODE:
                raise _Answer(404, status(404, "NotFound", f'nodedevices "{p[1]}" not found'))
            return 200, {
                "kind": "NodeDevices",
                "metadata": {"name": NODE},
                "status": self._devices(),
            }
        namespaced = len(p) == 3 and p[0] == "namespaces" and p[2] == "reassignments"
        if (p == ["reassignments"] or namespaced) and m == "POST":
            self._expect_kind(req.body, "Reassignment")
            result = self._reassign(req.body["spec"])
            return 201, {"kind": "Reassignment", "apiVersion": api, "status": result}
        if len(p) >= 3 and p[0] == "namespaces" and p[2] == "gpumounts":
            ns = p[1]
            if m == "POST" and len(p) == 3:
                self._expect_kind(req.body, "GPUMount")
                pod = req.body["metadata"]["name"]
                result = self._mount(ns, pod, req.body["spec"])
                return 201, self._gpumount(ns, pod, result)
            if m == "GET" and len(p) == 4:
                return 200, self._gpumount(ns, p[3], self._pod_devices(ns, p[3]))
            if m == "DELETE" and len(p) == 4:
                refs = req.query.get("device")
                return 200, self._gpumount(ns, p[3], self._unmount(ns, p[3], refs, req.query))
        raise _Answer(
            404, status(404, "NotFound", "the server could not find the requested resource")
        )

    @staticmethod
    def _expect_kind(body: Any, kind: str) -> None:
        if not isinstance(body, dict) or body.get("kind") != kind or "spec" not in body:
            raise _Answer(400, status(400, "BadRequest", f"want a {kind}"))
        if body.get("apiVersion") != "hotmount.io/v1alpha1":
            raise _Answer(400, status(400, "BadRequest", "wrong apiVersion"))

    @staticmethod
    def _gpumount(ns: str, pod: str, result: Any) -> dict[str, Any]:
        return {
            "apiVersion": "hotmount.io/v1alpha1",
            "kind": "GPUMount",
            "metadata": {"name": pod, "namespace": ns},
            "status": result,
        }

    # -- canned results
    @staticmethod
    def _resolve(ref: str) -> dict[str, Any]:
        gpu = _gpu(ref)
        if gpu is None:
            if re.fullmatch(r"\d+:\d+", ref):
                raise _Answer(400, status(400, "InvalidDevice", f"device {ref} is refused"))
            message = f"device {ref!r} is not in this node's inventory"
            raise _Answer(404, status(404, "DeviceNotFound", message))
        return gpu

    def _devices(self) -> dict[str, Any]:
        devices = []
        for gpu in GPUS:
            holder = None
            if gpu["index"] == 1:
                holder = {"source": "hotmount", "namespace": "ml", "pod": "nb-0",
                          "container": "main", "containerId": CONTAINER_ID}  # fmt: skip
            devices.append(
                {
                    "key": gpu["uuid"],
                    "kind": "gpu",
                    "index": gpu["index"],
                    "uuid": gpu["uuid"],
                    "pciBusId": f"0000:0{gpu['index'] + 1}:00.0",
                    "minor": gpu["minor"],
                    "parent": None,
                    "nodes": [f"/dev/nvidia{gpu['minor']}"],
                    "holder": holder,
                }
            )
        return {"node": NODE, "devices": devices}

    def _pod_devices(self, ns: str | None, pod: str | None) -> dict[str, Any]:
        device = _mounted(GPUS[1])
        if (other := self.shares.get((ns, pod))) is not None:
            device["sharedWith"] = other
            device["otherHolders"] = [
                {"source": "hotmount", "namespace": ns, "pod": other, "container": "main",
                 "containerId": "f" * 64, "device": GPUS[1]["uuid"]}
            ]  # fmt: skip
        if (reclaim_in := self.warned.get((ns, pod))) is not None:
            device.update(idleTimeout="30m", idleSeconds=1800 - reclaim_in)
            device.update(idlePolicy="unused", reclaimInSeconds=reclaim_in)
        device.update(self.device_fields.get((ns, pod), {}))
        return {
            "namespace": ns,
            "pod": pod,
            "containers": [{"container": "main", "containerId": CONTAINER_ID, "devices": [device]}],
        }

    def _mount(self, ns: str | None, pod: str | None, body: Any) -> dict[str, Any]:
        try:
            request = MountRequest.model_validate(body)
        except ValidationError as exc:
            raise _Answer(422, status(422, "Invalid", str(exc))) from exc
        if request.count is not None:
            gpus = GPUS[: request.count]
            holder = f"{pod}-gpu-holder-x1y2z"
        else:
            gpus = [self._resolve(r) for r in request.devices or []]
            holder = None
        names = request.container_names()
        names = POD_CONTAINERS if names == ["*"] else names
        if request.share_with is not None:
            self.shares[(ns, pod)] = request.share_with
        done = [
            {
                "container": name or ("main" if pod else None),
                "containerId": container_id(name),
                "mounted": [self._into(g, request.share_with) for g in gpus if g["index"] != 1],
                "alreadyMounted": [self._into(g, None) for g in gpus if g["index"] == 1],
            }
            for name in names
        ]
        several = done if request.containers is not None else []
        return {"namespace": ns, "pod": pod, **done[0], "holderPod": holder, "containers": several}

    @staticmethod
    def _into(gpu: dict[str, Any], share_with: str | None) -> dict[str, Any]:
        mounted = _mounted(gpu)
        if share_with is not None:
            mounted["sharedWith"] = share_with
        return mounted

    def _unmount(
        self, ns: str | None, pod: str | None, refs: list[str] | None, query: dict[str, list[str]]
    ) -> dict[str, Any]:
        gpus = [self._resolve(r) for r in refs] if refs else [GPUS[1]]
        force = query.get("force", ["false"])[0] == "true"
        return {
            "namespace": ns,
            "pod": pod,
            "container": query.get("container", ["main" if pod else None])[0],
            "containerId": CONTAINER_ID,
            "unmounted": [g["uuid"] for g in gpus if g["index"] == 1],
            "notMounted": [g["uuid"] for g in gpus if g["index"] != 1],
            "stoppedPids": [4242] if force else [],
            "holderPodsDeleted": [],
        }

    def _reassign(self, body: Any) -> dict[str, Any]:
        try:
            request = ReassignRequest.model_validate(body)
        except ValidationError as exc:
            raise _Answer(422, status(422, "Invalid", str(exc))) from exc
        gpu = self._resolve(request.device)
        src = request.from_.model_dump(by_alias=True, exclude_none=True)
        dst = request.to.model_dump(by_alias=True, exclude_none=True)
        return {
            "device": gpu["uuid"],
            "from": src,
            "to": dst,
            "unmounted": {
                "namespace": src["namespace"],
                "pod": src["pod"],
                "container": "main",
                "containerId": CONTAINER_ID,
                "unmounted": [gpu["uuid"]],
                "notMounted": [],
                "stoppedPids": [4242] if request.force else [],
            },
            "mounted": {
                "namespace": dst["namespace"],
                "pod": dst["pod"],
                "container": "main",
                "containerId": "d" * 64,
                "mounted": [_mounted(gpu)],
                "alreadyMounted": [],
            },
        }
