"""/metrics on the real node: the real API server's TokenReview and SubjectAccessReview
decide, as they do for the kubelet's metrics. Nobody scrapes anonymously; a person
with no grant is refused; bound to the shipped `hotmount-metrics-reader`, they scrape.

The host reaches the agent at its pod IP, as Prometheus' pod discovery does
(`Release.scrape`).
"""

from __future__ import annotations

from tests.k8s import flows
from tests.k8s.node.cluster import Node

READER_ROLE = "hotmount-metrics-reader"


def test_metrics_need_a_token_allowed_to_get_the_url(node: Node, hotmount: flows.Release) -> None:
    anonymous = hotmount.scrape(None)
    assert anonymous.status_code == 401, anonymous.text
    assert "hotmount_" not in anonymous.text

    alice = node.tokens["alice"]
    refused = hotmount.scrape(alice)
    assert refused.status_code == 403, refused.text
    assert "hotmount_" not in refused.text and "/metrics" in refused.json()["message"]

    binding = flows.new_name("alice-metrics")
    node.kubectl("create", "clusterrolebinding", binding, f"--clusterrole={READER_ROLE}",
                 "--user=alice")  # fmt: skip
    try:
        # The agent keeps its refusal briefly (--authz-cache-ttl), then asks again.
        served = flows.wait_for(
            "alice may scrape once bound",
            lambda: (r := hotmount.scrape(alice)).status_code == 200 and r,
            60,
        )
        assert "hotmount_requests_in_agent" in served.text
    finally:
        node.kubectl("delete", "clusterrolebinding", binding, check=False)
