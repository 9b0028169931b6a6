"""Authorizer cache keys and the gateway's fan-out, without a cluster."""

from __future__ import annotations

from typing import Any

import pytest

from agent.auth.assertion import asserted_user, assertion_headers
from agent.auth.authorize import Authorizer
from agent.auth.identity import ASSERT_GROUP, Identity
from agent.cluster.gateway import FanOut, Gateway
from agent.config import AgentSettings
from agent.errors import Forbidden
from agent.kube.client import PodInfo, UserInfo


class FakeReviews:
    """Allows a user only when its extra carries scope `full`, and only for uid `u1`."""

    def __init__(self) -> None:
        self.asked: list[UserInfo] = []

    def subject_access_review(self, user: UserInfo, *args: Any, **kwargs: Any) -> tuple[bool, str]:
        self.asked.append(user)
        allowed = user.extra.get("scopes") == ["full"] and user.uid in ("", "u1")
        return allowed, "" if allowed else "scoped"


@pytest.mark.parametrize(
    ("first", "second"),
    [
        (UserInfo("alice", ["ml"], "", {"scopes": ["full"]}), UserInfo("alice", ["ml"], "", {})),
        (
            UserInfo("alice", ["ml"], "", {"scopes": ["full"]}),
            UserInfo("alice", ["ml"], "", {"scopes": ["read-only"]}),
        ),
        (
            UserInfo("alice", ["ml"], "u1", {"scopes": ["full"]}),
            UserInfo("alice", ["ml"], "u2", {"scopes": ["full"]}),
        ),
    ],
    ids=["extra-absent", "extra-differs", "uid-differs"],
)
def test_a_cached_decision_is_never_reused_for_another_uid_or_extra(
    first: UserInfo, second: UserInfo
) -> None:
    reviews = FakeReviews()
    authorizer = Authorizer(reviews, ttl=60)  # type: ignore[arg-type]
    authorizer.require(Identity(first, "front-proxy"), "create", "default", "nb")
    with pytest.raises(Forbidden):
        authorizer.require(Identity(second, "front-proxy"), "create", "default", "nb")
    assert reviews.asked == [first, second]
    # the same user again is served from the cache
    authorizer.require(Identity(first, "front-proxy"), "create", "default", "nb")
    assert len(reviews.asked) == 2


class FakeAgents:
    def agent_pods(self, namespace: str, selector: str) -> list[PodInfo]:
        agent = PodInfo("gpu-hotmount", "agent-b", "u", "node-b", "Running", [], pod_ip="10.0.0.2")
        return [agent]

    def token(self) -> str:
        return "agent-token"


@pytest.mark.parametrize("via", ["unix", "anonymous", "static-token"])
def test_fan_out_never_carries_a_node_local_identity_to_other_nodes(via: str) -> None:
    settings = AgentSettings(node_name="node-a")
    gateway = Gateway(settings, FakeAgents())  # type: ignore[arg-type]
    sent: list[Any] = []
    gateway._send = lambda *args, **kwargs: sent.append(args)  # type: ignore[method-assign]
    gateway._list_one = lambda *args, **kwargs: sent.append(args)  # type: ignore[method-assign]
    root = Identity(UserInfo("system:node-local:root", ["system:masters"]), via, True)
    try:
        assert gateway.fan_out(root, "/apis/hotmount.io/v1alpha1/nodedevices") == FanOut()
    finally:
        gateway.close()
    assert sent == []


def test_front_proxy_extra_keys_are_percent_decoded_as_kubernetes_sends_them() -> None:
    from agent.auth.authenticate import Authenticator
    from agent.auth.identity import CallerContext, FrontProxyTrust

    authenticator = Authenticator(AgentSettings(), None, FrontProxyTrust(frozenset()))
    caller = CallerContext(
        headers={
            "x-remote-user": ["alice"],
            "x-remote-group": ["ml", "system:authenticated"],
            "x-remote-extra-authentication.kubernetes.io%2fpod-name": ["nb-0"],
        },
        listener="tcp",
        peer_cert={"subject": ((("commonName", "front-proxy-client"),),)},
    )

    identity = authenticator.authenticate(caller)

    assert identity.via == "front-proxy"
    assert identity.user.groups == ["ml", "system:authenticated"]
    assert identity.user.extra == {"authentication.kubernetes.io/pod-name": ["nb-0"]}


def test_an_assertion_never_carries_a_privileged_group() -> None:
    """A front-proxy admin in system:masters is asserted without it: receiving agents
    refuse that group, and RBAC decides on the rest (here `ops`)."""
    admin = UserInfo("admin", ["system:masters", "ops", "system:nodes", "system:authenticated"])
    headers: dict[str, list[str]] = {}
    for name, value in assertion_headers(admin):
        headers.setdefault(name, []).append(value)
    assert headers[ASSERT_GROUP] == ["ops", "system:authenticated"]
    assert asserted_user("admin", headers).groups == ["ops", "system:authenticated"]


UID = "6b1a7c3e-0000-4000-8000-000000000001"  # pod default/nb's
NOTEBOOK = "system:serviceaccount:default:notebook"
BOUND = {
    "authentication.kubernetes.io/pod-name": ["nb"],
    "authentication.kubernetes.io/pod-uid": [UID],
}


class ForceReviews:
    """Allows every verb but `force`, as the shipped hotmount-user does."""

    def __init__(self) -> None:
        self.verbs: list[str] = []

    def subject_access_review(
        self, user: UserInfo, verb: str, *args: Any, **kwargs: Any
    ) -> tuple[bool, str]:
        self.verbs.append(verb)
        return verb != "force", ""


@pytest.mark.parametrize("via", ["token", "front-proxy", "gateway"])
def test_taking_a_held_gpu_by_suspend_is_force(via: str) -> None:
    """A suspend that found processes holding the GPUs asks `force`, as a forced unmount
    does; an asserted user is refused before any review without the opt-in."""
    reviews = ForceReviews()
    authorizer = Authorizer(reviews, ttl=0)  # type: ignore[arg-type]
    identity = Identity(UserInfo("dana", ["team-a"], "", {}), via)
    with pytest.raises(Forbidden) as refused:
        authorizer.require_taking_held(identity, "default", "nb", 2, UID)
    assert "2 processes hold the GPUs of pod default/nb" in refused.value.message
    assert "nothing was changed" in refused.value.message
    assert reviews.verbs == ([] if via == "gateway" else ["force"])


def test_a_trusted_caller_takes_a_held_gpu_unasked() -> None:
    reviews = ForceReviews()
    authorizer = Authorizer(reviews, ttl=0)  # type: ignore[arg-type]
    root = Identity(UserInfo("system:node-root", [], "", {}), "unix", trusted=True)
    authorizer.require_taking_held(root, "default", "nb", 1, UID)
    assert reviews.verbs == []


@pytest.mark.parametrize(
    ("user", "via", "asks_force"),
    [
        (UserInfo(NOTEBOOK, [], "", BOUND), "token", False),
        (UserInfo(NOTEBOOK, [], "", BOUND), "front-proxy", False),
        (UserInfo(NOTEBOOK, [], "", BOUND), "gateway", None),  # asserted: refused unasked
        (UserInfo(NOTEBOOK, [], "", {**BOUND, "authentication.kubernetes.io/pod-uid": ["x"]}),
         "token", True),  # an earlier pod of the same name
        (UserInfo(NOTEBOOK, [], "", {"authentication.kubernetes.io/pod-name": ["nb"]}),
         "token", True),  # no UID to prove it
        (UserInfo("system:serviceaccount:other:notebook", [], "", BOUND), "token", True),
        (UserInfo("dana", [], "", BOUND), "front-proxy", True),  # not a ServiceAccount
    ],
    ids=["own-token", "own-through-api-server", "asserted", "old-pod", "no-uid",
         "other-namespace", "a-person"],
)  # fmt: skip
def test_the_pod_itself_suspends_its_own_processes(
    user: UserInfo, via: str, asks_force: bool | None
) -> None:
    """A token bound to the pod (name and UID) suspends it without `force`: the pod acts
    on itself, as the idle policy `suspend` does; anyone else is asked `force`."""
    reviews = ForceReviews()
    authorizer = Authorizer(reviews, ttl=0)  # type: ignore[arg-type]
    identity = Identity(user, via)
    if asks_force is False:
        authorizer.require_taking_held(identity, "default", "nb", 1, UID)
    else:
        with pytest.raises(Forbidden):
            authorizer.require_taking_held(identity, "default", "nb", 1, UID)
    assert reviews.verbs == (["force"] if asks_force else [])
