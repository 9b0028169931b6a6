"""The refused-token cache: one TokenReview per bad token, and bounded in size.

Runs the Authenticator against a stand-in for our own KubeClient seam (it counts the
reviews it is asked for); the real-wire flood is tests/agent/test_hostile_callers.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.auth.authenticate import Authenticator
from agent.auth.identity import CallerContext
from agent.config import AgentSettings
from agent.errors import Unauthorized
from agent.kube.client import UserInfo


class CountingReviews:
    def __init__(self) -> None:
        self.reviewed: list[str] = []

    def token_review(self, token: str, audiences: list[str]) -> UserInfo | None:
        self.reviewed.append(token)
        return UserInfo("alice", ["ml"]) if token == "good" else None


def bearer(token: str) -> CallerContext:
    return CallerContext(headers={"authorization": [f"Bearer {token}"]}, listener="tcp")


def authenticator(tmp_path: Path, ttl: float) -> tuple[Authenticator, CountingReviews]:
    settings = AgentSettings(state_dir=tmp_path, token_failure_ttl=ttl, authz_cache_ttl=0)
    reviews = CountingReviews()
    return Authenticator(settings, reviews), reviews  # type: ignore[arg-type]


def test_a_refused_token_is_reviewed_once(tmp_path: Path) -> None:
    auth, reviews = authenticator(tmp_path, ttl=60)
    for _ in range(100):
        with pytest.raises(Unauthorized):
            auth.authenticate(bearer("bad"))
    assert reviews.reviewed == ["bad"]
    assert auth.authenticate(bearer("good")).name == "alice"  # others are still reviewed


def test_the_cache_is_bounded_and_evicts_the_oldest(tmp_path: Path) -> None:
    auth, reviews = authenticator(tmp_path, ttl=60)
    flood = [f"bad-{n}" for n in range(5000)]
    for token in flood:
        with pytest.raises(Unauthorized):
            auth.authenticate(bearer(token))
    assert auth._refused is not None and len(auth._refused) == 4096
    for token in (flood[-1], flood[0]):  # the newest is remembered, the oldest evicted
        with pytest.raises(Unauthorized):
            auth.authenticate(bearer(token))
    assert reviews.reviewed[5000:] == [flood[0]]


def test_a_zero_ttl_turns_the_cache_off(tmp_path: Path) -> None:
    auth, reviews = authenticator(tmp_path, ttl=0)
    for _ in range(3):
        with pytest.raises(Unauthorized):
            auth.authenticate(bearer("bad"))
    assert reviews.reviewed == ["bad"] * 3
