"""tests/support/promql.py finds the metric names of PromQL, and only those."""

from __future__ import annotations

import pytest

from tests.support.promql import exported_names, metric_names, unexported

CASES = [
    ('up{job="gpu-hotmount"} == 0', {"up"}),
    (
        "timestamp(a_seconds{job=\"x\"}) - a_seconds{job='x'} > 30",
        {"a_seconds"},
    ),
    ('increase(b_total{job="x",kind=~"a|b"}[30m]) >= 3', {"b_total"}),
    (
        "histogram_quantile(0.99, sum by (le, operation) "
        '(rate(c_seconds_bucket{node=~"$node"}[$__rate_interval])))',
        {"c_seconds_bucket"},
    ),
    ('d{state="reviewing"} >= ignoring(state) group_left(pod) e_limit', {"d", "e_limit"}),
    ("count without (instance) (f > 0) * on(node) g", {"f", "g"}),
    ("sum(rate(h_total[5m] offset 1h)) / 1e3 and bool i", {"h_total", "i"}),
    ("label_values(j_total, job)", {"j_total"}),
    ('label_values(k{job=~"$job"}, node)', {"k"}),
    ("max_over_time(l[5m:1m]) or vector(0)", {"l"}),
]


@pytest.mark.parametrize(("expr", "names"), CASES)
def test_metric_names_of_known_expressions(expr: str, names: set[str]) -> None:
    assert metric_names(expr) == names


EXPOSITION = """\
# HELP ops_total Calls
# TYPE ops_total counter
# HELP lat_seconds Latency
# TYPE lat_seconds histogram
lat_seconds_bucket{le="+Inf"} 1.0
lat_seconds_count 1.0
lat_seconds_sum 0.5
# HELP g A gauge with labels and no sample yet
# TYPE g gauge
"""


def test_exported_names_by_type_and_histogram_suffixes() -> None:
    exported = exported_names(EXPOSITION)
    assert {"ops_total", "lat_seconds_bucket", "lat_seconds_count", "g"} <= exported
    assert "ops" not in exported  # a counter's samples are `_total`
    assert unexported({"ops_total", "lat_seconds_sum", "g"}, exported) == set()
    assert unexported({"ops", "lat_seconds_bucketz", "missing"}, exported) == {
        "ops",
        "lat_seconds_bucketz",
        "missing",
    }
