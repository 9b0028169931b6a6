"""A real Prometheus on the real node (flow 26, issue 42): Debian's `prometheus` scraping
the agent as the chart's ServiceMonitor says, with the chart's PrometheusRule loaded.

The chart is upgraded with its monitoring switched on, as an operator of
kube-prometheus-stack does, after the Prometheus Operator's own CRDs
(tests/deploy/monitoring/crds) are in the API server: the API server checks the
ServiceMonitor and the PrometheusRule against them, and the token controller fills the
scrape account's token Secret. Then, as the operator would, the ServiceMonitor, the
PrometheusRule and the dashboard's ConfigMap are read back from the API server and
turned into Prometheus' configuration (tests/support/prometheus_config.py): discovery
of the Services' EndpointSlices through the real API server, with a ServiceAccount of
Prometheus' own that may only list and watch them, the monitor's relabelings, TLS
against the chart's CA, and the chart's metrics-reader token. Nothing names the agent's
address: discovery finds it. Debian's `prometheus` is built without Kubernetes
discovery, so that one part is served to it over HTTP discovery by the test
(tests/k8s/kube_discovery.py: the same target groups and meta labels, listed live);
the relabelings, TLS and token are the real Prometheus' own.

Test-only changes, each said where it is made: a scrape every 2 s and a rule evaluation
every second (SCRAPE, EVALUATE), and every rule's `for:` at most MAX_FOR; the
expressions are the chart's, rendered with the values in `monitoring_values`.
"""

from __future__ import annotations

import base64
import json
import math
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.k8s import flows
from tests.k8s.flows import NAMESPACE, RELEASE
from tests.k8s.kube_discovery import HttpDiscovery
from tests.k8s.node.cluster import NODE_NAME, Node
from tests.support import prometheus_config as config
from tests.support.ports import free_port

PROMETHEUS = shutil.which("prometheus")  # Debian's `prometheus` (scripts/setup.sh)
CRDS = flows.REPO / "tests" / "deploy" / "monitoring" / "crds"
# Seconds between scrapes (each may take as long) and between rule evaluations; test-only:
# fast. A scrape may take 2 s on the busy 2-core CI machine (a 1 s one seemed to miss
# the double-booked gauge once).
SCRAPE, EVALUATE = 2.0, 1.0
MAX_FOR = "2s"  # every rule's `for:` at most this (test-only: HotmountAgentDown's is 5m)
# HotmountOnDemandQueueNotDraining's window (`rules.onDemandQueue.for`, 10m by default): in
# flow 26 the third notebook waits about 11 s, with no GPU attached meanwhile.
QUEUE_WINDOW = "5s"
JOB = RELEASE  # the job the ServiceMonitor gives: the Service's name
DASHBOARD_KEY = "gpu-hotmount.json"  # in the dashboard's ConfigMap
# Prometheus' own account: lists and watches what endpoint discovery reads, nothing more.
DISCOVERY_ACCOUNT, DISCOVERY_NAMESPACE = "prometheus", "default"
DISCOVERY_RBAC = [
    {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": "hotmount-test-prometheus"},
        "rules": [
            {
                "apiGroups": [""],
                "resources": ["services", "endpoints", "pods"],
                "verbs": ["get", "list", "watch"],
            },
            {
                "apiGroups": ["discovery.k8s.io"],
                "resources": ["endpointslices"],
                "verbs": ["get", "list", "watch"],
            },
        ],
    },
    {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": "hotmount-test-prometheus"},
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole",
            "name": "hotmount-test-prometheus",
        },
        "subjects": [
            {"kind": "ServiceAccount", "name": DISCOVERY_ACCOUNT, "namespace": DISCOVERY_NAMESPACE}
        ],
    },
]


def cannot(why: str) -> None:
    """Skip, saying why; under CI, where setup.sh installed everything, fail instead."""
    if os.environ.get("CI"):
        pytest.fail(f"CI is set but this cannot run: {why}")
    pytest.skip(why)


def monitoring_values(queue_window: str) -> dict[str, Any]:
    """The chart's monitoring, all on. `queue_window`: HotmountOnDemandQueueNotDraining's
    window (`rules.onDemandQueue.for`, 10m by default), the knob an operator turns."""
    return {
        "rules": {"enabled": True, "onDemandQueue": {"for": queue_window}},
        "dashboard": {"enabled": True},
        "serviceMonitor": {"enabled": True},
    }


@dataclass
class Prometheus:
    url: str
    workdir: Path
    process: subprocess.Popen[bytes]
    discovery: HttpDiscovery
    dashboard: dict[str, Any]
    started: float = field(default_factory=time.time)

    def _get(self, path: str, **params: Any) -> Any:
        answer = httpx.get(f"{self.url}{path}", params=params, timeout=30)
        body = answer.json()
        assert answer.status_code == 200 and body["status"] == "success", (path, params, body)
        return body["data"]

    def query(self, expr: str, at: float | None = None) -> list[dict[str, Any]]:
        data = self._get("/api/v1/query", query=expr, **({"time": at} if at else {}))
        return list(data["result"])

    def query_range(self, expr: str, start: float, end: float, step: float) -> list[dict[str, Any]]:
        data = self._get("/api/v1/query_range", query=expr, start=start, end=end, step=step)
        return list(data["result"])

    def label_values(self, label: str, selector: str, start: float, end: float) -> list[str]:
        params = {"match[]": selector, "start": start, "end": end}
        return list(self._get(f"/api/v1/label/{label}/values", **params))

    def targets(self) -> dict[str, Any]:
        return dict(self._get("/api/v1/targets"))

    def firing(self, alert: str) -> list[dict[str, Any]]:
        """The alert's instances firing now (/api/v1/alerts)."""
        alerts = self._get("/api/v1/alerts")["alerts"]
        return [a for a in alerts if a["labels"]["alertname"] == alert and a["state"] == "firing"]

    def fired_between(self, alert: str, start: float, end: float) -> list[float]:
        """When the rule manager recorded the alert firing (its ALERTS series)."""
        expr = f'ALERTS{{alertname="{alert}",alertstate="firing"}}'
        series = self.query_range(expr, start, end, EVALUATE)
        return sorted(float(t) for s in series for t, _ in s["values"])

    def scrape_health(self) -> str:
        """How the scrapes went since the start: for a failure's message."""
        since = f"{max(1, round(time.time() - self.started))}s"
        parts = []
        for what, expr in (
            ("scrapes", f"count_over_time(up[{since}])"),
            ("failed", f"count_over_time((up == 0)[{since}:{SCRAPE:g}s])"),
            ("slowest", f"max_over_time(scrape_duration_seconds[{since}])"),
        ):
            parts += [f"{what} {r['value'][1]}" for r in self.query(expr)]
        return ", ".join(parts)

    def log_tail(self) -> str:
        return (self.workdir / "prometheus.log").read_text(errors="replace")[-4000:]

    def stop(self) -> None:
        """The process, the discovery and the directory gone, whatever state they are in."""
        try:
            if self.process.poll() is None:
                self.process.terminate()
                try:
                    self.process.wait(15)
                except subprocess.TimeoutExpired:
                    self.process.kill()
                    self.process.wait(15)
        finally:
            self.discovery.stop()
            shutil.rmtree(self.workdir, ignore_errors=True)


def start(node: Node, release: flows.Release) -> Prometheus:
    """The chart's monitoring on, and a Prometheus configured from what the API server
    holds, scraping the agent (its target up) before this returns."""
    if PROMETHEUS is None:
        cannot("no prometheus: `apt-get install prometheus` (scripts/setup.sh does, as root)")
    assert PROMETHEUS is not None
    node.kubectl("apply", "-f", str(CRDS))
    names = [yaml.safe_load(p.read_text())["metadata"]["name"] for p in sorted(CRDS.glob("*"))]
    node.kubectl("wait", "--for=condition=Established", "--timeout=60s",
                 *(f"crd/{name}" for name in names))  # fmt: skip
    # Objects beside the agent's: its pod stays as it is (no new pod to wait for).
    release.monitoring = monitoring_values(QUEUE_WINDOW)
    release.values_file.write_text(yaml.safe_dump(release.values()))
    release.helm("upgrade", RELEASE, str(flows.CHART), "-n", NAMESPACE, "-f",
                 str(release.values_file))  # fmt: skip
    monitor = _get(node, "servicemonitor", RELEASE)
    rule = _get(node, "prometheusrule", RELEASE)
    dashboard = json.loads(_get(node, "configmap", f"{RELEASE}-dashboard")["data"][DASHBOARD_KEY])
    workdir = Path(tempfile.mkdtemp(prefix="hotmount-prometheus-"))
    discovery: HttpDiscovery | None = None
    try:
        scrape, assets = config.scrape_config(
            monitor, 0, lambda ns, name, key: _secret(node, ns, name, key),
            assets_dir=str(workdir / "certs"),
        )  # fmt: skip
        for path, content in assets.items():
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            Path(path).write_text(content)
        # Debian's prometheus has no kubernetes_sd_configs: the same discovery over HTTP
        [sd] = scrape.pop("kubernetes_sd_configs")
        assert sd["role"] == "endpointslice", sd
        discovery = HttpDiscovery(node.server, str(node.ca.cert_path),
                                  _discovery_token(node), sd["namespaces"]["names"])  # fmt: skip
        scrape["http_sd_configs"] = [{"url": discovery.serve(), "refresh_interval": "2s"}]
        (workdir / "rules.yaml").write_text(yaml.safe_dump(config.rule_groups(rule, MAX_FOR)))
        every = f"{SCRAPE:g}s"
        settings = {
            "global": {"scrape_interval": every, "scrape_timeout": every,
                       "evaluation_interval": f"{EVALUATE:g}s"},
            "rule_files": [str(workdir / "rules.yaml")],
            "scrape_configs": [scrape],
        }  # fmt: skip
        (workdir / "prometheus.yml").write_text(yaml.safe_dump(settings))
        (workdir / "prometheus.yml").chmod(0o600)  # it holds the scrape token
        port = free_port()
        with (workdir / "prometheus.log").open("wb") as log:
            process = subprocess.Popen(
                [PROMETHEUS, f"--config.file={workdir / 'prometheus.yml'}",
                 f"--storage.tsdb.path={workdir / 'data'}",
                 f"--web.listen-address=127.0.0.1:{port}"],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True,
            )  # fmt: skip
    except BaseException:
        if discovery is not None:
            discovery.stop()
        shutil.rmtree(workdir, ignore_errors=True)
        raise
    prometheus = Prometheus(f"http://127.0.0.1:{port}", workdir, process, discovery, dashboard)
    try:
        flows.wait_for("Prometheus is ready", lambda: _ready(prometheus), 60)
        flows.wait_for("Prometheus scrapes the agent", lambda: _scraping(prometheus), 60)
    except BaseException as error:
        tail = f"{prometheus.log_tail()}\ndiscovery errors: {discovery.errors[-3:]}"
        prometheus.stop()
        if isinstance(error, AssertionError):
            raise AssertionError(f"{error}\n$ prometheus (its log)\n{tail}") from None
        raise
    return prometheus


def _get(node: Node, kind: str, name: str) -> dict[str, Any]:
    found = node.kubectl("get", kind, name, "-n", NAMESPACE, "-o", "json").stdout
    return dict(json.loads(found))


def _secret(node: Node, namespace: str, name: str, key: str) -> str:
    """A Secret's value, as the operator reads it; a token Secret once it is filled."""

    def value() -> str | None:
        found = node.kubectl("get", "secret", name, "-n", namespace, "-o", "json").stdout
        data = json.loads(found).get("data") or {}
        return base64.b64decode(data[key]).decode() if key in data else None

    return str(flows.wait_for(f"Secret {namespace}/{name} holds {key}", value, 60))


def _discovery_token(node: Node) -> str:
    """A token of Prometheus' own account, which may list and watch what discovery reads."""
    node.kubectl(
        "create", "serviceaccount", DISCOVERY_ACCOUNT, "-n", DISCOVERY_NAMESPACE, check=False
    )
    node.apply(DISCOVERY_RBAC)
    token = node.kubectl(
        "create", "token", DISCOVERY_ACCOUNT, "-n", DISCOVERY_NAMESPACE, "--duration=2h"
    ).stdout
    return token.strip()


def _ready(prometheus: Prometheus) -> bool:
    if prometheus.process.poll() is not None:
        raise AssertionError(f"prometheus exited: {prometheus.process.returncode}")
    try:
        return httpx.get(f"{prometheus.url}/-/ready", timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


def _scraping(prometheus: Prometheus) -> list[dict[str, Any]] | None:
    active = prometheus.targets()["activeTargets"]
    up = [t for t in active if t["health"] == "up"]
    return up or None


def dashboard_data(prometheus: Prometheus, start: float, end: float) -> dict[str, int]:
    """Each dashboard query (`panel [refId]: expr`) and how many series it draws with at
    least one number (not NaN), over [start, end] as Grafana asks for it."""
    window = config.Window(start, end, SCRAPE)
    values = window.builtins()
    for variable in config.variable_queries(prometheus.dashboard):
        selector = config.substitute(variable.selector, values)
        found = prometheus.label_values(variable.label, selector, start, end)
        assert found, f"variable ${variable.name}: no values for {selector}"
        values[variable.name] = config.regex_value(found)  # "All": every value
    drawn = {}
    for query in config.dashboard_queries(prometheus.dashboard, values):
        if query.instant:
            series = [{"values": [r["value"]]} for r in prometheus.query(query.expr, end)]
        else:
            series = prometheus.query_range(query.expr, start, end, window.interval_ms / 1000)
        numbers = [s for s in series if any(not math.isnan(float(v)) for _, v in s["values"])]
        drawn[f"{query.panel} [{query.ref_id}]: {query.expr}"] = len(numbers)
    return drawn


def metadata(prometheus: Prometheus, metric: str) -> list[dict[str, Any]]:
    """What the scraped targets say a metric is (HELP, TYPE)."""
    return list(prometheus._get("/api/v1/metadata", metric=metric).get(metric, []))


def the_target(prometheus: Prometheus) -> dict[str, Any]:
    """The one target up, and the other Service's endpoints dropped by the relabelings."""
    targets = prometheus.targets()
    [target] = targets["activeTargets"]
    dropped = [
        t["discoveredLabels"].get("__meta_kubernetes_service_name")
        for t in targets["droppedTargets"]
    ]
    assert f"{RELEASE}-local" in dropped, dropped
    labels = target["labels"]
    assert (labels["job"], labels["node"], labels["namespace"]) == (JOB, NODE_NAME, NAMESPACE)
    return dict(target)
