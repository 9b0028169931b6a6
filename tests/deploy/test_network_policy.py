"""The NetworkPolicy on the agents' port (issue 29): on by default, off by a value; the
agents, the API server, the scraper and the clients named in values, and no one else.

The API server's addresses come from values, else from the `kubernetes` Service's
Endpoints read by Helm's `lookup` (checked against a small API server speaking the real
wire format, `helm template --dry-run=server`). Where neither names them (an offline
render: `helm template`, Argo CD, Flux; the plain manifest) no API-server peer is
admitted, and the render and the install's notes say so (issue 40): a policy that admits
0.0.0.0/0 keeps no pod off the port on networks that match pod traffic by address.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.deploy.support import (
    CHART,
    KUBE,
    Obj,
    find,
    load_dir,
    load_documents,
    lookup_server,
    render_notes,
    without_helm_labels,
)
from tests.deploy.test_helm import HELM, helm, render, render_values

pytestmark = pytest.mark.skipif(HELM is None, reason="no helm (see tests/deploy/test_helm.py)")
AGENTS = {"podSelector": {"matchLabels": {"app.kubernetes.io/name": "gpu-hotmount"}}}
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


EVERYWHERE = {"0.0.0.0/0", "::/0"}
NO_API_SERVER = "no API-server peer"  # what an offline render and the notes say


def every_address(peers: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The peers that admit every address, of either family."""
    return [p for p in peers if p.get("ipBlock", {}).get("cidr") in EVERYWHERE]


def test_on_by_default_the_agents_and_the_scraper() -> None:
    assert admitted(render()) == [AGENTS, MONITORING]


def test_an_offline_render_admits_no_address_at_large() -> None:
    """`helm template` cannot look the API server up: it admits no API-server peer rather
    than 0.0.0.0/0 and ::/0, and says so in the manifest it prints."""
    text = helm("template", "gpu-hotmount", str(CHART), "--namespace", "gpu-hotmount").stdout
    assert every_address(admitted(load_documents(text))) == []
    assert NO_API_SERVER in text and "networkPolicy.apiServer" in text


def test_the_plain_manifests_ship_the_same_policy() -> None:
    """Without an API-server peer either; the API server's address is for the operator to
    add (its comment says how), so nothing admits every address meanwhile."""
    shipped = find(load_dir(KUBE), "NetworkPolicy")
    assert without_helm_labels(policy(render())) == shipped
    assert every_address(admitted([shipped])) == []
    assert NO_API_SERVER in (KUBE / "09-networkpolicy.yaml").read_text()


def notes(tmp_path: Path, *sets: str, options: tuple[str, ...] = ()) -> str:
    assert HELM is not None
    return render_notes(HELM, tmp_path, *sets, options=options)


def test_the_notes_warn_when_no_api_server_peer_is_admitted(tmp_path: Path) -> None:
    offline = notes(tmp_path)
    assert NO_API_SERVER in offline and "networkPolicy.apiServer" in offline
    named = notes(tmp_path / "named", "networkPolicy.apiServer[0].ipBlock.cidr=10.0.0.10/32")
    assert NO_API_SERVER not in named
    assert NO_API_SERVER not in notes(tmp_path / "off", "networkPolicy.enabled=false")


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
    online = ("--dry-run=server", "--kubeconfig", str(kubeconfig))
    objects = render(options=online)
    assert admitted(objects) == [
        AGENTS,
        {"ipBlock": {"cidr": "192.168.7.2/32"}},
        {"ipBlock": {"cidr": "fd00::7/128"}},
        MONITORING,
    ]
    assert NO_API_SERVER not in notes(kubeconfig.parent / "notes", options=online)
