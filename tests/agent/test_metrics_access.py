"""/metrics names every namespace's pods and GPUs: it is authenticated (TokenReview) and
authorized (SubjectAccessReview, `get` on the non-resource URL /metrics) as the kubelet's
and controller-runtime's metrics endpoints are. The shipped ClusterRole
`hotmount-metrics-reader` grants it; `--metrics-anonymous` opens it for scrapers without
tokens. Real agent process, fake API server answering the reviews on the wire."""

from __future__ import annotations

import httpx
import pytest

from tests.agent.conftest import ALICE, BOB, METRICS, METRICS_USER, Cluster
from tests.agent.test_auth import assert_status

pytestmark = pytest.mark.kernel
FAMILY = "hotmount_requests_in_agent"  # any of the agent's families: what must not leak
NAMED = 'pod="nb"'  # the tenant's pod, as hotmount_gpu_mounted_info names it


def test_anonymous_and_unauthorized_scrapers_get_nothing(cluster: Cluster) -> None:
    cluster.pod("nb")
    agent = cluster.agent()
    with agent.client(ALICE) as alice:  # a mount, so the metrics would name a pod
        assert (
            alice.post(
                "/v1/namespaces/default/pods/nb/devices", json={"devices": ["0"]}
            ).status_code
            == 200
        )
    with httpx.Client(base_url=agent.url, timeout=30) as anonymous:
        answer = anonymous.get("/metrics")
    assert_status(answer, 401, "Unauthorized")
    assert FAMILY not in answer.text and NAMED not in answer.text

    with agent.client("no-such-token") as stranger:
        assert_status(stranger.get("/metrics"), 401, "Unauthorized")

    # Authenticated, but neither bob (no rights) nor alice (every gpumounts verb in
    # `default`) holds `get /metrics`.
    for token, user in ((BOB, "bob"), (ALICE, "alice")):
        with agent.client(token) as caller:
            refused = caller.get("/metrics")
        body = assert_status(refused, 403, "Forbidden")
        assert body["message"] == f'user "{user}" cannot get path "/metrics"'
        assert FAMILY not in refused.text and NAMED not in refused.text

    with agent.client(METRICS) as scraper:
        scraped = scraper.get("/metrics")
    assert scraped.status_code == 200, scraped.text
    assert FAMILY in scraped.text
    assert NAMED in scraped.text

    asked = [r["spec"] for r in cluster.kube.reviews("SubjectAccessReview")]
    scrape_reviews = [r for r in asked if r["user"] == METRICS_USER]
    assert scrape_reviews, asked
    for review in scrape_reviews:
        assert review["nonResourceAttributes"] == {"path": "/metrics", "verb": "get"}
        assert "resourceAttributes" not in review


def test_probes_stay_open(cluster: Cluster) -> None:
    """The kubelet's probes and the image's HEALTHCHECK send no token."""
    agent = cluster.agent()
    with httpx.Client(base_url=agent.url, timeout=30) as anonymous:
        assert anonymous.get("/healthz").status_code == 200
        assert anonymous.get("/readyz").status_code == 200


def test_metrics_anonymous_opens_metrics_and_nothing_else(cluster: Cluster) -> None:
    agent = cluster.agent(extra=["--metrics-anonymous"])
    with httpx.Client(base_url=agent.url, timeout=30) as anonymous:
        scraped = anonymous.get("/metrics")
        assert scraped.status_code == 200, scraped.text
        assert FAMILY in scraped.text
        assert_status(anonymous.get("/v1/devices"), 401, "Unauthorized")
    assert cluster.kube.reviews("TokenReview") == []  # nobody was asked about anybody
