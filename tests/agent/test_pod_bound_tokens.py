"""--pod-tokens-own-pod-only: notebooks that share one ServiceAccount (z2jh's singleuser
pods) each act on their own pod alone. A pod's mounted token is bound to that pod: its
TokenReview names the pod in `extra` (authentication.kubernetes.io/pod-name), which is
what the agent checks. Real agent process, fake API server, runc pods."""

from __future__ import annotations

import pytest

from tests.agent.conftest import ALICE, Cluster, shipped_role
from tests.support.agent import GPUS

pytestmark = pytest.mark.kernel
NOTEBOOKS = "system:serviceaccount:default:notebook"  # one account for every user's pod
ALICE_POD, BOB_POD = "alice-pod-token", "bob-pod-token"


def devices(pod: str) -> str:
    return f"/v1/namespaces/default/pods/{pod}/devices"


def shared_account(cluster: Cluster) -> None:
    for token, pod in ((ALICE_POD, "jupyter-alice"), (BOB_POD, "jupyter-bob")):
        extra = {"authentication.kubernetes.io/pod-name": [pod]}
        cluster.kube.add_token(token, NOTEBOOKS, ["system:serviceaccounts"], extra=extra)
    cluster.kube.bind_role(shipped_role("hotmount-user"), user=NOTEBOOKS, namespace="default")


def test_a_pod_bound_token_acts_on_its_own_pod_only(cluster: Cluster) -> None:
    shared_account(cluster)
    alice = cluster.pod("jupyter-alice")
    cluster.pod("jupyter-bob")
    agent = cluster.agent(extra=["--pod-tokens-own-pod-only"])
    with agent.client(ALICE_POD) as alices, agent.client(BOB_POD) as bobs:
        own = alices.post(devices("jupyter-alice"), json={"devices": ["0"]})
        assert own.status_code == 200, own.text

        detach = bobs.delete(f"{devices('jupyter-alice')}/0")
        take = bobs.post(devices("jupyter-alice"), json={"devices": ["1"]})
        peek = bobs.get(devices("jupyter-alice"))

        for refused in (detach, take, peek):
            assert refused.status_code == 403, refused.text
            assert refused.json()["reason"] == "Forbidden"
            assert "bound to pod default/jupyter-bob" in refused.json()["message"]
        assert f"nvidia{GPUS[0].minor}" in alice.ls_dev()
        assert f"nvidia{GPUS[1].minor}" not in alice.ls_dev()
        assert bobs.post(devices("jupyter-bob"), json={"devices": ["1"]}).status_code == 200
    with agent.client(ALICE) as person:  # a person's token carries no pod: RBAC alone
        assert person.get(devices("jupyter-bob")).status_code == 200


def test_without_the_flag_rbac_alone_lets_a_shared_account_reach_every_pod(
    cluster: Cluster,
) -> None:
    """Why the flag (and docs/notebooks.md) exist: hotmount-user bound to a shared account
    lets any of its pods detach another's GPU."""
    shared_account(cluster)
    alice = cluster.pod("jupyter-alice")
    cluster.pod("jupyter-bob")
    agent = cluster.agent()
    with agent.client(ALICE_POD) as alices, agent.client(BOB_POD) as bobs:
        assert alices.post(devices("jupyter-alice"), json={"devices": ["0"]}).status_code == 200
        assert bobs.delete(f"{devices('jupyter-alice')}/0").status_code == 200
    assert f"nvidia{GPUS[0].minor}" not in alice.ls_dev()


def test_through_the_api_server_the_bound_pod_still_decides(cluster: Cluster) -> None:
    """The aggregated face: the API server passes the token's extra on (X-Remote-Extra-,
    percent-encoded key), and the agent applies the same rule."""
    shared_account(cluster)
    alice = cluster.pod("jupyter-alice")
    cluster.pod("jupyter-bob")
    backend = cluster.aggregated_agent(extra=["--pod-tokens-own-pod-only"])
    with backend.agent.client(ALICE_POD) as alices:
        assert alices.post(devices("jupyter-alice"), json={"devices": ["0"]}).status_code == 200
    gpumounts = "/apis/hotmount.io/v1alpha1/namespaces/default/gpumounts"
    with cluster.api(BOB_POD) as bobs:
        refused = bobs.delete(f"{gpumounts}/jupyter-alice")

        assert refused.status_code == 403, refused.text
        assert "bound to pod default/jupyter-bob" in refused.json()["message"]
        assert f"nvidia{GPUS[0].minor}" in alice.ls_dev()
        own = bobs.get(f"{gpumounts}/jupyter-bob")
        assert own.status_code == 200, own.text


# -- --refuse-unbound-service-account-tokens ----------------------------------------------------

UNBOUND = "legacy-secret-token"  # the same account's token, bound to no pod (a Secret's)


def test_an_unbound_service_account_token_is_refused_with_the_option(cluster: Cluster) -> None:
    """Its TokenReview names no pod (no pod-name/pod-uid extra): --pod-tokens-own-pod-only
    has no pod to hold it to, so the option refuses it. Pod-bound tokens, people's tokens
    and calls forwarded by the agents (whose own token asserts the pod-bound user) pass."""
    shared_account(cluster)
    cluster.kube.add_token(UNBOUND, NOTEBOOKS, ["system:serviceaccounts"])
    alice = cluster.pod("jupyter-alice")
    bob = cluster.pod("jupyter-bob", node="node-b")
    options = ["--pod-tokens-own-pod-only", "--refuse-unbound-service-account-tokens"]
    agent = cluster.agent(extra=options)
    cluster.agent("node-b", extra=options)
    with agent.client(UNBOUND) as legacy:
        for refused in (
            legacy.post(devices("jupyter-alice"), json={"devices": ["0"]}),
            legacy.get(devices("jupyter-alice")),
            legacy.delete(f"{devices('jupyter-alice')}/0"),
        ):
            assert refused.status_code == 403, refused.text
            assert refused.json()["reason"] == "Forbidden"
            assert "bound to no pod" in refused.json()["message"]
    assert f"nvidia{GPUS[0].minor}" not in alice.ls_dev()

    with agent.client(ALICE_POD) as alices, agent.client(BOB_POD) as bobs:
        assert alices.post(devices("jupyter-alice"), json={"devices": ["0"]}).status_code == 200
        forwarded = bobs.post(devices("jupyter-bob"), json={"devices": ["1"]})  # to node-b
        assert forwarded.status_code == 200, forwarded.text
    assert f"nvidia{GPUS[0].minor}" in alice.ls_dev()
    assert f"nvidia{GPUS[1].minor}" in bob.ls_dev()
    with agent.client(ALICE) as person:  # not a ServiceAccount: RBAC alone
        assert person.get(devices("jupyter-alice")).status_code == 200


def test_without_the_option_an_unbound_token_is_held_to_no_pod(cluster: Cluster) -> None:
    """Today's default, and why the option exists: --pod-tokens-own-pod-only alone lets an
    unbound token of the shared account act on every pod its RBAC reaches."""
    shared_account(cluster)
    cluster.kube.add_token(UNBOUND, NOTEBOOKS, ["system:serviceaccounts"])
    alice = cluster.pod("jupyter-alice")
    agent = cluster.agent(extra=["--pod-tokens-own-pod-only"])
    with agent.client(UNBOUND) as legacy:
        taken = legacy.post(devices("jupyter-alice"), json={"devices": ["0"]})
    assert taken.status_code == 200, taken.text
    assert f"nvidia{GPUS[0].minor}" in alice.ls_dev()
