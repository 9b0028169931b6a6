"""What a Prometheus and a Grafana make of the chart's monitoring objects, as pure functions
the real-node tier runs a real `prometheus` with (tests/k8s/prometheus.py):

- `scrape_config`: a ServiceMonitor turned into a scrape job the way the Prometheus
  Operator turns it (pkg/prometheus/promcfg.go, `generateServiceMonitorConfig`): a
  `kubernetes_sd_configs` discovery of the Services' endpoints in the selected
  namespaces, relabelings that keep the selected Services (matchLabels,
  matchExpressions) and the named port, the operator's own target labels, the job from
  the Service's name, the monitor's relabelings, scheme, path, TLS and authorization.
  The Secrets it names are read through `secret` (the operator reads them from the API
  server): the token inline as `credentials`, the CA as a file (an asset).
  `apiserver` is the Prometheus resource's `apiserverConfig`: a Prometheus outside the
  cluster (the tier's, on the host) reaches the API server with it.
- `rule_groups`: a PrometheusRule's groups as a rule file, with each `for:` shortened
  to at most `max_for` (a test cannot wait 5 minutes); expressions untouched.
- `dashboard_queries`: every target of a Grafana dashboard with its variables
  substituted as Grafana substitutes them for a Prometheus data source ($__interval,
  $__rate_interval, $__range, and multi-value template variables as regexes).

tests/deploy/test_prometheus_config.py holds them to the chart; promtool checks the
configuration they make.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

Obj = dict[str, Any]
SecretReader = Callable[[str, str, str], str]  # (namespace, name, key) -> the value

# Where the operator mounts TLS assets in its Prometheus pod (tlsAssetsDir).
TLS_ASSETS = "/etc/prometheus/certs"
_INVALID_LABEL_CHARS = re.compile(r"[^a-zA-Z0-9_]")
# RelabelConfig's fields, camelCase in the CRD, snake_case in Prometheus' configuration.
_RELABEL_FIELDS = (
    ("sourceLabels", "source_labels"),
    ("separator", "separator"),
    ("targetLabel", "target_label"),
    ("regex", "regex"),
    ("modulus", "modulus"),
    ("replacement", "replacement"),
    ("action", "action"),
)


def sanitize(name: str) -> str:
    """A Kubernetes label name as Prometheus' discovery spells it in a meta label."""
    return _INVALID_LABEL_CHARS.sub("_", name)


def scrape_config(
    monitor: Obj,
    index: int,
    secret: SecretReader,
    *,
    role: str = "endpointslice",
    apiserver: Obj | None = None,
    assets_dir: str = TLS_ASSETS,
) -> tuple[Obj, dict[str, str]]:
    """The scrape job for the monitor's `index`th endpoint, and the TLS assets it reads
    (file path to content). `role`: `endpointslice` (the operator with EndpointSlice
    discovery) or `endpoints`."""
    if role not in ("endpoints", "endpointslice"):
        raise ValueError(f"role {role!r}: endpoints or endpointslice")
    namespace, name = monitor["metadata"]["namespace"], monitor["metadata"]["name"]
    spec = monitor["spec"]
    endpoint = spec["endpoints"][index]
    job: Obj = {"job_name": f"serviceMonitor/{namespace}/{name}/{index}"}
    job["honor_labels"] = bool(endpoint.get("honorLabels", False))
    if "honorTimestamps" in endpoint:
        job["honor_timestamps"] = bool(endpoint["honorTimestamps"])
    job["kubernetes_sd_configs"] = [_discovery(spec, namespace, role, apiserver)]
    for field, key in (
        ("interval", "scrape_interval"),
        ("scrapeTimeout", "scrape_timeout"),
        ("path", "metrics_path"),
        ("scheme", "scheme"),
    ):
        if endpoint.get(field):
            job[key] = endpoint[field]
    assets: dict[str, str] = {}
    if "tlsConfig" in endpoint:
        job["tls_config"] = _tls(endpoint["tlsConfig"], namespace, secret, assets_dir, assets)
    if "authorization" in endpoint:
        job["authorization"] = _authorization(endpoint["authorization"], namespace, secret)
    if "bearerTokenSecret" in endpoint:
        ref = endpoint["bearerTokenSecret"]
        job["bearer_token"] = secret(namespace, ref["name"], ref["key"])
    job["relabel_configs"] = _relabelings(spec, endpoint, role)
    job["metric_relabel_configs"] = [_relabel(r) for r in endpoint.get("metricRelabelings", [])]
    return job, assets


def _discovery(spec: Obj, namespace: str, role: str, apiserver: Obj | None) -> Obj:
    selector = spec.get("namespaceSelector", {})
    sd: Obj = {"role": role}
    if not selector.get("any"):
        sd["namespaces"] = {"names": list(selector.get("matchNames") or [namespace])}
    if apiserver:
        sd.update(apiserver)
    return sd


def _tls(
    tls: Obj, namespace: str, secret: SecretReader, assets_dir: str, assets: dict[str, str]
) -> Obj:
    out: Obj = {"insecure_skip_verify": bool(tls.get("insecureSkipVerify", False))}
    for field, key in (("ca", "ca_file"), ("cert", "cert_file")):
        ref = tls.get(field, {}).get("secret")
        if ref:
            path = f"{assets_dir}/secret_{namespace}_{ref['name']}_{ref['key']}"
            assets[path] = secret(namespace, ref["name"], ref["key"])
            out[key] = path
        elif tls.get(field, {}).get("configMap"):
            raise NotImplementedError("a TLS asset from a ConfigMap")
    if tls.get("keySecret"):
        ref = tls["keySecret"]
        path = f"{assets_dir}/secret_{namespace}_{ref['name']}_{ref['key']}"
        assets[path] = secret(namespace, ref["name"], ref["key"])
        out["key_file"] = path
    if tls.get("serverName"):
        out["server_name"] = tls["serverName"]
    return out


def _authorization(auth: Obj, namespace: str, secret: SecretReader) -> Obj:
    out: Obj = {"type": (auth.get("type") or "Bearer").strip()}
    ref = auth.get("credentials")
    if ref:
        out["credentials"] = secret(namespace, ref["name"], ref["key"])
    return out


def _relabelings(spec: Obj, endpoint: Obj, role: str) -> list[Obj]:
    """The operator's relabelings, in its order."""
    meta = (
        "__meta_kubernetes_endpointslice"
        if role == "endpointslice"
        else ("__meta_kubernetes_endpoint")
    )
    out: list[Obj] = [{"source_labels": ["job"], "target_label": "__tmp_prometheus_job_name"}]
    selector = spec.get("selector", {})
    for label in sorted(selector.get("matchLabels", {})):
        out.append(
            {
                "action": "keep",
                "source_labels": _service_label(label),
                "regex": f"({selector['matchLabels'][label]});true",
            }
        )
    for expression in selector.get("matchExpressions", []):
        out.append(_match_expression(expression))
    if endpoint.get("port"):
        out.append(
            {"action": "keep", "source_labels": [f"{meta}_port_name"], "regex": endpoint["port"]}
        )
    elif endpoint.get("targetPort") is not None:
        port = str(endpoint["targetPort"])
        which = "number" if port.isdigit() else "name"
        source = f"__meta_kubernetes_pod_container_port_{which}"
        out.append({"action": "keep", "source_labels": [source], "regex": port})
    target = [f"{meta}_address_target_kind", f"{meta}_address_target_name"]
    out += [
        {
            "source_labels": target,
            "separator": ";",
            "regex": "Node;(.*)",
            "replacement": "${1}",
            "target_label": "node",
        },
        {
            "source_labels": target,
            "separator": ";",
            "regex": "Pod;(.*)",
            "replacement": "${1}",
            "target_label": "pod",
        },
        {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
        {"source_labels": ["__meta_kubernetes_service_name"], "target_label": "service"},
        {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
        {"source_labels": ["__meta_kubernetes_pod_container_name"], "target_label": "container"},
    ]
    for label in spec.get("targetLabels", []):
        out.append(_copy_label(f"__meta_kubernetes_service_label_{sanitize(label)}", label))
    for label in spec.get("podTargetLabels", []):
        out.append(_copy_label(f"__meta_kubernetes_pod_label_{sanitize(label)}", label))
    out.append(
        {
            "source_labels": ["__meta_kubernetes_service_name"],
            "target_label": "job",
            "replacement": "${1}",
        }
    )
    if spec.get("jobLabel"):
        out.append(
            _copy_label(f"__meta_kubernetes_service_label_{sanitize(spec['jobLabel'])}", "job")
        )
    if endpoint.get("port") or endpoint.get("targetPort") is not None:
        port = str(endpoint.get("port") or endpoint["targetPort"])
        out.append({"target_label": "endpoint", "replacement": port})
    out += [_relabel(r) for r in endpoint.get("relabelings", [])]
    # One shard: the operator's hashmod and keep, with $(SHARD) as the pod fills it in.
    out += [
        {
            "source_labels": ["__address__"],
            "target_label": "__tmp_hash",
            "modulus": 1,
            "action": "hashmod",
        },
        {"source_labels": ["__tmp_hash"], "regex": "0", "action": "keep"},
    ]
    return out


def _service_label(label: str) -> list[str]:
    return [
        f"__meta_kubernetes_service_label_{sanitize(label)}",
        f"__meta_kubernetes_service_labelpresent_{sanitize(label)}",
    ]


def _match_expression(expression: Obj) -> Obj:
    key, operator = expression["key"], expression["operator"]
    values = "|".join(expression.get("values", []))
    present = [f"__meta_kubernetes_service_labelpresent_{sanitize(key)}"]
    if operator == "In":
        return {"action": "keep", "source_labels": _service_label(key), "regex": f"({values});true"}
    if operator == "NotIn":
        return {"action": "drop", "source_labels": _service_label(key), "regex": f"({values});true"}
    if operator == "Exists":
        return {"action": "keep", "source_labels": present, "regex": "true"}
    if operator == "DoesNotExist":
        return {"action": "drop", "source_labels": present, "regex": "true"}
    raise ValueError(f"matchExpressions operator {operator!r}")


def _copy_label(source: str, target: str) -> Obj:
    return {
        "source_labels": [source],
        "target_label": sanitize(target),
        "regex": "(.+)",
        "replacement": "${1}",
    }


def _relabel(relabeling: Obj) -> Obj:
    """A RelabelConfig of the CRD as Prometheus spells it (only the fields it has)."""
    out: Obj = {}
    for field, key in _RELABEL_FIELDS:
        value = relabeling.get(field)
        if value in (None, "", []):
            continue
        out[key] = str(value).lower() if field == "action" else value
    return out


# ---- rules ----------------------------------------------------------------------

_DURATION = re.compile(r"(\d+)(ms|s|m|h|d|w|y)")
_UNIT_SECONDS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}


def seconds(duration: str) -> float:
    """A Prometheus duration (`1h30m`, `500ms`) in seconds."""
    parts = _DURATION.findall(duration)
    if not parts or "".join(n + u for n, u in parts) != duration:
        raise ValueError(f"not a Prometheus duration: {duration!r}")
    return sum(int(n) * _UNIT_SECONDS[u] for n, u in parts)


def rule_groups(rule: Obj, max_for: str) -> Obj:
    """The PrometheusRule's groups as a rule file, every `for:` longer than `max_for`
    shortened to it. The expressions, labels and annotations stay as they are."""
    limit = seconds(max_for)
    groups = []
    for group in rule["spec"]["groups"]:
        rules = []
        for original in group["rules"]:
            one = dict(original)
            if "for" in one and seconds(str(one["for"])) > limit:
                one["for"] = max_for
            rules.append(one)
        groups.append({**group, "rules": rules})
    return {"groups": groups}


# ---- the dashboard ---------------------------------------------------------------

# Grafana's rangeutil.roundInterval: a raw interval (ms) to the "nice" one it uses.
_NICE_INTERVALS_MS = (
    (15, 10),
    (35, 20),
    (75, 50),
    (150, 100),
    (350, 200),
    (750, 500),
    (1500, 1000),
    (3500, 2000),
    (7500, 5000),
    (12500, 10000),
    (17500, 15000),
    (25000, 20000),
    (45000, 30000),
    (90000, 60000),
    (210000, 120000),
    (450000, 300000),
    (750000, 600000),
    (1050000, 900000),
    (1500000, 1200000),
    (2700000, 1800000),
    (5400000, 3600000),
)
_REGEX_SPECIALS = re.compile(r"[$^*{}\[\]'+?.()|]")
_VARIABLE = re.compile(r"\$\{(\w+)(?::\w+)?\}|\[\[(\w+)\]\]|\$(\w+)")


def round_interval(ms: float) -> int:
    for below, nice in _NICE_INTERVALS_MS:
        if ms < below:
            return nice
    return 3600000


def _duration(ms: int) -> str:
    return f"{ms // 1000}s" if ms % 1000 == 0 else f"{ms}ms"


@dataclass(frozen=True)
class Window:
    """The dashboard's time range as Grafana computes its built-in variables from it:
    `scrape_interval` is the data source's "Scrape interval" (its minimum interval),
    `max_points` the panel's width in points (Grafana's maxDataPoints)."""

    start: float
    end: float
    scrape_interval: float
    max_points: int = 1000

    @property
    def interval_ms(self) -> int:
        raw = (self.end - self.start) * 1000 / self.max_points
        return max(round_interval(raw), round(self.scrape_interval * 1000))

    def builtins(self) -> dict[str, str]:
        scrape = round(self.scrape_interval * 1000)
        rate = max(self.interval_ms + scrape, 4 * scrape)  # Grafana's $__rate_interval
        return {
            "__interval": _duration(self.interval_ms),
            "__interval_ms": str(self.interval_ms),
            "__rate_interval": _duration(rate),
            "__range": f"{round(self.end - self.start)}s",
            "__range_s": str(round(self.end - self.start)),
            "__range_ms": str(round((self.end - self.start) * 1000)),
        }


def regex_value(values: list[str]) -> str:
    """A multi-value or include-All variable's values as Grafana's Prometheus data source
    puts them into a query: regex-escaped (for a PromQL string, so `\\\\`), one value
    alone, several as `(a|b)`."""
    escaped = [
        _REGEX_SPECIALS.sub(lambda m: "\\\\" + m.group(0), v.replace("\\", "\\\\\\\\"))
        for v in values
    ]
    return escaped[0] if len(escaped) == 1 else "(" + "|".join(escaped) + ")"


def substitute(text: str, values: Mapping[str, str]) -> str:
    """`$name`, `${name}` and `[[name]]` replaced; a name not in `values` is an error."""

    def one(match: re.Match[str]) -> str:
        name = next(g for g in match.groups() if g)
        if name not in values:
            raise KeyError(f"no value for Grafana variable ${name} in {text!r}")
        return values[name]

    return _VARIABLE.sub(one, text)


@dataclass(frozen=True)
class VariableQuery:
    """A `label_values(selector, label)` query variable: Grafana asks Prometheus for the
    label's values on the series the selector selects (which may name earlier ones)."""

    name: str
    selector: str
    label: str


_LABEL_VALUES = re.compile(r"^\s*label_values\s*\(\s*(.+?)\s*,\s*(\w+)\s*\)\s*$")


def variable_queries(dashboard: Obj) -> list[VariableQuery]:
    """The dashboard's query variables, in order (a later one may use an earlier one)."""
    found = []
    for variable in dashboard.get("templating", {}).get("list", []):
        if variable.get("type") != "query":
            continue
        query = variable["query"]
        text = query["query"] if isinstance(query, dict) else query
        parsed = _LABEL_VALUES.match(text)
        if not parsed:
            raise ValueError(f"variable {variable['name']}: not label_values(...): {text!r}")
        found.append(VariableQuery(variable["name"], parsed.group(1), parsed.group(2)))
    return found


@dataclass(frozen=True)
class PanelQuery:
    panel: str
    ref_id: str
    expr: str  # as Grafana sends it
    instant: bool  # an instant query at the range's end, else a range query


def dashboard_queries(dashboard: Obj, values: Mapping[str, str]) -> list[PanelQuery]:
    """Every panel target, its variables substituted (`values`: the template variables'
    query values and Window.builtins())."""
    out = []
    for panel in _panels(dashboard):
        for target in panel.get("targets", []):
            if target.get("hide") or not target.get("expr"):
                continue
            instant = bool(target.get("instant")) and not target.get("range", False)
            out.append(
                PanelQuery(
                    panel.get("title", ""),
                    target.get("refId", ""),
                    substitute(target["expr"], values),
                    instant,
                )
            )
    return out


def _panels(dashboard: Obj) -> list[Obj]:
    panels = []
    for panel in dashboard.get("panels", []):
        panels.append(panel)
        panels += panel.get("panels", [])  # a collapsed row keeps its panels
    return panels
