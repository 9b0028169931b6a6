"""/metrics on the real node: the real API server's TokenReview and SubjectAccessReview
decide, as they do for the kubelet's metrics. Nobody scrapes anonymously; a person
with no grant is refused; bound to the shipped `hotmount-metrics-reader`, they scrape.

The host reaches the agent at its pod IP (on the node's CNI bridge), as Prometheus'
pod discovery does, and checks the certificate against the agents' Service name.
"""

from __future__ import annotations

import json
import ssl

import httpx

from tests.k8s import flows
from tests.k8s.flows import NAMESPACE, RELEASE
from tests.k8s.node.cluster import Node

READER_ROLE = "hotmount-metrics-reader"
AGENT_PORT = 8443  # the chart's `port`


def scrape(hotmount: flows.Release, token: str | None) -> httpx.Response:
    context = ssl.create_default_context(cadata=hotmount.ca_bundle())
    headers = {"authorization": f"Bearer {token}"} if token else {}
    pod = json.loads(
        hotmount.node.kubectl(
            "get", "pod", str(hotmount.agent_pod()), "-n", NAMESPACE, "-o", "json"
        ).stdout
    )
    with httpx.Client(verify=context, timeout=30) as client:
        return client.get(
            f"https://{pod['status']['podIP']}:{AGENT_PORT}/metrics",
            headers=headers,
            extensions={"sni_hostname": f"{RELEASE}.{NAMESPACE}.svc"},
        )


def test_metrics_need_a_token_allowed_to_get_the_url(node: Node, hotmount: flows.Release) -> None:
    anonymous = scrape(hotmount, None)
    assert anonymous.status_code == 401, anonymous.text
    assert "hotmount_" not in anonymous.text

    alice = node.tokens["alice"]
    refused = scrape(hotmount, alice)
    assert refused.status_code == 403, refused.text
    assert "hotmount_" not in refused.text and "/metrics" in refused.json()["message"]

    binding = flows.new_name("alice-metrics")
    node.kubectl("create", "clusterrolebinding", binding, f"--clusterrole={READER_ROLE}",
                 "--user=alice")  # fmt: skip
    try:
        # The agent keeps its refusal briefly (--authz-cache-ttl), then asks again.
        served = flows.wait_for(
            "alice may scrape once bound",
            lambda: (r := scrape(hotmount, alice)).status_code == 200 and r,
            60,
        )
        assert "hotmount_requests_in_agent" in served.text
    finally:
        node.kubectl("delete", "clusterrolebinding", binding, check=False)
