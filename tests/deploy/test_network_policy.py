"""The NetworkPolicy on the agents' port (issue 29): on by default, off by a value; the
agents, the API server, the scraper and the clients named in values, and no one else.

The API server's addresses come from values, else from the `kubernetes` Service's
Endpoints read by Helm's `lookup` (checked against a small API server speaking the real
wire format, `helm template --dry-run=server`), else every address.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.deploy.support import KUBE, Obj, find, load_dir, lookup_server, without_helm_labels
from tests.deploy.test_helm import HELM, render, render_values

pytestmark = pytest.mark.skipif(HELM is None, reason="no helm (see tests/deploy/test_helm.py)")
AGENTS = {"podSelector": {"matchLabels": {"app.kubernetes.io/name": "gpu-hotmount"}}}
EVERY_ADDRESS = [{"ipBlock": {"cidr": "0.0.0.0/0"}}, {"ipBlock": {"cidr": "::/0"}}]
MONITORING = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}


def policy(objects: list[Obj]) -> Obj:
    return find(objects, "NetworkPolicy")


def admitted(objects: list[Obj]) -> list[dict[str, Any]]:
    """The peers admitted, after checking the policy's shape: ingress only, on the agents,
    one rule, the agents' port only."""
    spec = policy(objects)["spec"]
    assert spec["podSelector"] == AGENTS["podSelector"]
    assert spec["policyTypes"] == ["Ingress"]
    [rule] = spec["ingress"]
    assert rule["ports"] == [{"port": "https", "protocol": "TCP"}]
    return list(rule["from"])


def test_on_by_default_the_agents_the_api_server_and_the_scraper() -> None:
    assert admitted(render()) == [AGENTS, *EVERY_ADDRESS, MONITORING]


def test_the_plain_manifests_ship_the_same_policy() -> None:
    shipped = find(load_dir(KUBE), "NetworkPolicy")
    assert without_helm_labels(policy(render())) == shipped


def test_off_by_a_value() -> None:
    assert not [o for o in render("networkPolicy.enabled=false") if o["kind"] == "NetworkPolicy"]


def test_the_api_server_and_clients_from_values(tmp_path: Path) -> None:
    """Named API server addresses replace `every address`; notebooks' namespaces are
    admitted next to the scraper."""
    notebooks = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "nb"}}}
    konnectivity = {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
        "podSelector": {"matchLabels": {"k8s-app": "konnectivity-agent"}},
    }
    values = {
        "networkPolicy": {
            "apiServer": [{"ipBlock": {"cidr": "10.0.0.10/32"}}, konnectivity],
            "clients": [notebooks],
            "metricsScrapers": [],
        }
    }
    peers = admitted(render_values(tmp_path, values))
    assert peers == [AGENTS, {"ipBlock": {"cidr": "10.0.0.10/32"}}, konnectivity, notebooks]


ENDPOINTS = {"name": "endpoints", "singularName": "endpoints", "kind": "Endpoints"}


@pytest.fixture
def kubeconfig(tmp_path: Path) -> Iterator[Path]:
    """An API server whose `kubernetes` Endpoints name two addresses, for Helm's lookup."""
    endpoints = {
        "apiVersion": "v1", "kind": "Endpoints",
        "metadata": {"name": "kubernetes", "namespace": "default"},
        "subsets": [{"addresses": [{"ip": ip} for ip in ("192.168.7.2", "fd00::7")],
                     "ports": [{"name": "https", "port": 6443}]}],
    }  # fmt: skip
    with lookup_server(tmp_path, ENDPOINTS, {("default", "kubernetes"): endpoints}) as path:
        yield path


def test_an_install_admits_the_api_servers_own_addresses(kubeconfig: Path) -> None:
    """`helm install` reads the `kubernetes` Service's endpoints: those addresses, not
    every address."""
    objects = render(options=("--dry-run=server", "--kubeconfig", str(kubeconfig)))
    assert admitted(objects) == [
        AGENTS,
        {"ipBlock": {"cidr": "192.168.7.2/32"}},
        {"ipBlock": {"cidr": "fd00::7/128"}},
        MONITORING,
    ]
