"""Prometheus' Kubernetes discovery for a Prometheus built without it (Debian's): an HTTP
discovery endpoint (`http_sd_configs`) that, at every refresh, lists the EndpointSlices,
Services and pods of the namespaces from the real API server, with Prometheus' own
ServiceAccount token, and answers the target groups and meta labels Prometheus' own
`kubernetes_sd_configs` (role `endpointslice`) would make of them
(tests/support/kubernetes_sd.py). Nothing here picks a target: the scrape job's
relabelings, run by Prometheus, do.
"""

from __future__ import annotations

import json
import ssl
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx

from tests.support.kubernetes_sd import endpointslice_groups

LISTS = {
    "slices": "/apis/discovery.k8s.io/v1/namespaces/{}/endpointslices",
    "services": "/api/v1/namespaces/{}/services",
    "pods": "/api/v1/namespaces/{}/pods",
}


@dataclass
class HttpDiscovery:
    api_server: str
    ca_file: str
    token: str
    namespaces: list[str]
    refreshes: int = 0
    errors: list[str] = field(default_factory=list)

    def groups(self) -> list[dict[str, Any]]:
        found: dict[str, list[Any]] = {kind: [] for kind in LISTS}
        context = ssl.create_default_context(cafile=self.ca_file)
        headers = {"authorization": f"Bearer {self.token}"}
        with httpx.Client(base_url=self.api_server, verify=context, headers=headers,
                          timeout=10) as client:  # fmt: skip
            for namespace in self.namespaces:
                for kind, path in LISTS.items():
                    answer = client.get(path.format(namespace))
                    answer.raise_for_status()
                    found[kind] += answer.json()["items"]
        self.refreshes += 1
        return endpointslice_groups(found["slices"], found["services"], found["pods"])

    def serve(self) -> str:
        """Start answering on a port of the host's loopback; the URL to give Prometheus."""
        discovery = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                try:
                    body, code = json.dumps(discovery.groups()).encode(), 200
                except Exception as error:  # Prometheus keeps the last groups it had
                    discovery.errors.append(repr(error))
                    body, code = repr(error).encode(), 500
                self.send_response(code)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return f"http://127.0.0.1:{self._server.server_address[1]}/targets"

    def stop(self) -> None:
        server = getattr(self, "_server", None)
        if server is not None:
            server.shutdown()
            server.server_close()
