"""Every metric the shipped alerts and dashboard name is one a running agent exports
(issue 34): the names are parsed from deploy/monitoring/ (the chart's rules and dashboard,
tests/deploy/test_monitoring.py holds them equal), the exported ones read from a real
agent's /metrics with the metrics-reader token, never from a list kept here. And the
families added for them count what they say. Real agent, fake API server."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from scripts.monitoring_files import DASHBOARD, RULES
from tests.agent.conftest import ALICE, METRICS, Cluster
from tests.agent.test_accounting import GPU0, blockers_gone, given, gpu_pod, mount, unmount
from tests.agent.test_idle_reclaim import HUNG, counter, mount_fuse_gpu
from tests.agent.test_idle_reclaim import samples as samples_of
from tests.support.agent import AgentProcess
from tests.support.promql import exported_names, metric_names, unexported
from tests.support.waiting import wait_for

pytestmark = pytest.mark.kernel
# Series Prometheus makes itself for each scrape target: no agent exports them.
SCRAPE_SERIES = {"up"}


def rule_exprs(path: Path) -> list[str]:
    groups = yaml.safe_load(path.read_text())["groups"]
    return [rule["expr"] for group in groups for rule in group["rules"]]


def dashboard_exprs(path: Path) -> list[str]:
    """Every panel target's query, and the template variables' queries."""
    dashboard = json.loads(path.read_text())
    exprs = [t["expr"] for panel in dashboard["panels"] for t in panel.get("targets", [])]
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            query = variable["query"]
            exprs.append(query["query"] if isinstance(query, dict) else query)
    return exprs


def samples(text: str, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    return {
        tuple(sorted(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name
    }


def test_every_metric_of_the_rules_and_dashboard_is_exported(cluster: Cluster) -> None:
    cluster.pod("nb")
    agent = cluster.agent(extra=["--max-token-reviews", "7"])
    with agent.client(ALICE) as alice:
        done = alice.post("/v1/namespaces/default/pods/nb/devices", json={"devices": ["0"]})
        assert done.status_code == 200, done.text
        refused = alice.post("/v1/namespaces/default/pods/ghost/devices", json={"devices": ["1"]})
        assert refused.status_code == 404, refused.text
    with agent.client(METRICS) as scraper:
        scraped = scraper.get("/metrics")
    assert scraped.status_code == 200, scraped.text
    exported = exported_names(scraped.text)

    from_rules = {n for e in rule_exprs(RULES) for n in metric_names(e)}
    from_dashboard = {n for e in dashboard_exprs(DASHBOARD) for n in metric_names(e)}
    assert len(from_rules) >= 7 and len(from_dashboard) >= 15, (from_rules, from_dashboard)
    assert unexported(from_rules - SCRAPE_SERIES, exported) == set()
    assert unexported(from_dashboard - SCRAPE_SERIES, exported) == set()

    # The families added for them say what they count.
    text = scraped.text
    assert samples(text, "hotmount_token_reviews_limit") == {(): 7.0}
    refusals = samples(text, "hotmount_operations_refused_total")
    assert refusals == {(("operation", "mount"), ("reason", "PodNotFound")): 1.0}


def node_gpus(agent: AgentProcess) -> dict[str, float]:
    with agent.client(METRICS) as scraper:
        scraped = scraper.get("/metrics")
    assert scraped.status_code == 200, scraped.text
    found = samples(scraped.text, "hotmount_node_gpus")
    assert {dict(labels)["node"] for labels in found} == {"node-a"}
    return {dict(labels)["state"]: value for labels, value in found.items()}


def test_node_gpus_puts_each_gpu_in_one_state(cluster: Cluster) -> None:
    """GPU 1 mounted by name is pinned; GPU 0 then goes to an ordinary GPU pod
    (allocated); after the unmount GPU 1 is free again. On a node whose GPUs no plugin
    advertises, a hot-mount needs no pin: hot_mounted."""
    cluster.pod("nb")
    agent = cluster.agent()
    assert node_gpus(agent) == {"free": 2, "allocated": 0, "hot_mounted": 0, "pinned": 0}
    assert mount(agent, "nb", devices=["1"]).status_code == 200
    blockers_gone(cluster)  # GPU 0's blocker goes a moment after the answer
    gpu_pod(cluster, "trainer-1")
    assert given(cluster, "trainer-1") == [GPU0.uuid]
    assert node_gpus(agent) == {"free": 0, "allocated": 1, "hot_mounted": 0, "pinned": 1}
    assert unmount(agent, "nb", "1").status_code == 200
    assert node_gpus(agent) == {"free": 1, "allocated": 1, "hot_mounted": 0, "pinned": 0}


def test_node_gpus_counts_an_unpinned_hot_mount(cluster: Cluster) -> None:
    cluster.kubelets["node-a"].set_allocatable("nvidia.com/gpu", [])
    cluster.pod("nb")
    agent = cluster.agent()
    assert mount(agent, "nb", devices=["0"]).status_code == 200
    assert node_gpus(agent) == {"free": 1, "allocated": 0, "hot_mounted": 1, "pinned": 0}


def test_a_reclaim_whose_unmount_fails_is_counted(cluster: Cluster) -> None:
    """The container's /dev turned read-only under the agent: the idle GPU's node cannot
    be removed, so the reclaim's unmount fails. It is logged and counted in
    hotmount_gpu_reclaim_failures_total{reason="error"} (what HotmountIdleReclaimFailing
    alerts on), never as reclaimed nor as skipped."""
    container = cluster.pod("nb")
    agent = cluster.agent()
    with agent.client(ALICE) as api:
        mount_fuse_gpu(api, "1s")
    enter = ["nsenter", "-t", str(container.pid), "-m", "-p"]
    subprocess.run([*enter, "/bin/busybox", "mount", "-o", "remount,ro", "/dev"], check=True)
    wait_for(lambda: reclaim_failures(agent, "error") >= 1, "a failed reclaim", timeout=HUNG)
    assert "cannot reclaim" in agent.log.read_text()
    assert "Read-only file system" in agent.log.read_text()
    assert counter(agent, "hotmount_gpus_reclaimed_total") == 0
    assert reclaim_failures(agent, "skipped") == 0


def reclaim_failures(agent: AgentProcess, reason: str) -> float:
    found = samples_of(agent, "hotmount_gpu_reclaim_failures_total")
    return sum(value for labels, value in found if labels.get("reason") == reason)
