"""`nvcli list` when some nodes do not answer: the table for the rest, one warning line per
missing node on stderr, exit 0, and the missing nodes in `-o json` (cli/partial.py).

Through the fake API server's front proxy to a real TLS agent (node-a), which fans out to
stand-ins registered as agent pods: one refuses, one never answers, one speaks plain
HTTP (the TLS handshake fails), and a GPU node has no agent pod at all.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.agent.conftest import ALICE, Cluster
from tests.cli.conftest import Run
from tests.fakes.agent_peers import AnsweringPeer, HangingPeer, refused_port
from tests.fakes.kube_apiserver import AccessRule
from tests.support.agent import agent_pod_manifest

pytestmark = pytest.mark.kernel
Nvcli = Callable[..., Run]
MISSING = {
    "node-refused": "Refused",
    "node-silent": "Timeout",
    "node-plain-http": "TLSError",
    "node-no-agent": "NoAgent",
}


@pytest.fixture
def config(real: Cluster, tmp_path: Path) -> Iterator[Path]:
    real.aggregated_agent("node-a", extra=["--list-timeout", "1"])
    plain, silent = AnsweringPeer(200), HangingPeer()
    real.kube.put_pod(agent_pod_manifest("node-refused", refused_port()))
    real.kube.put_pod(agent_pod_manifest("node-silent", silent.port))
    real.kube.put_pod(agent_pod_manifest("node-plain-http", plain.port))
    real.kube.put_node("node-no-agent", gpus=4)
    real.kube.allow(
        AccessRule(group="ml", api_group="hotmount.io", resource="nodedevices", verb="get")
    )
    try:
        yield real.kube.write_kubeconfig(tmp_path / "alice.kubeconfig", token=ALICE)
    finally:
        plain.stop()
        silent.stop()


def test_the_table_for_the_rest_and_one_warning_per_missing_node(
    nvcli: Nvcli, config: Path
) -> None:
    listed = nvcli("list", "--kubeconfig", str(config))
    assert listed.rc == 0, listed.err
    rows = listed.out.splitlines()
    assert rows[0].split()[0] == "NODE"
    assert {row.split()[0] for row in rows[1:]} == {"node-a"}
    warnings = listed.err.splitlines()
    assert len(warnings) == len(MISSING), listed.err
    for node, reason in MISSING.items():
        assert (
            sum(w.startswith(f"warning: node {node} did not answer ({reason}): ") for w in warnings)
            == 1
        )


def test_json_carries_the_missing_nodes(nvcli: Nvcli, config: Path) -> None:
    listed = nvcli("list", "--kubeconfig", str(config), "-o", "json")
    assert listed.rc == 0, listed.err
    entries = json.loads(listed.out)
    answered = [e for e in entries if "unavailable" not in e]
    assert [e["node"] for e in answered] == ["node-a"] and answered[0]["devices"]
    missing = {e["node"]: e for e in entries if "unavailable" in e}
    assert {n: e["unavailable"]["reason"] for n, e in missing.items()} == MISSING
    assert all(e["devices"] == [] and e["unavailable"]["message"] for e in missing.values())


def test_one_node_is_listed_without_asking_the_others(nvcli: Nvcli, config: Path) -> None:
    one = nvcli("list", "--node", "node-a", "--kubeconfig", str(config), "-o", "json")
    assert one.rc == 0, one.err
    assert one.err == ""
    assert [e["node"] for e in json.loads(one.out)] == ["node-a"]
