"""The front-proxy CA is read once, at start: an API server that does not answer yet is
waited for (found on a real node: an agent that started before its Service route existed
answered 401 to the aggregated API for its whole life while reporting Ready)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from agent.errors import Forbidden, UpstreamError
from agent.main import front_proxy_trust

CONFIGMAP = {
    "requestheader-client-ca-file": "-----BEGIN CERTIFICATE-----\n...",
    "requestheader-allowed-names": '["front-proxy-client"]',
}


class Kube:
    """The one KubeClient method front_proxy_trust calls, failing `failures` times first."""

    def __init__(self, failures: list[Exception]) -> None:
        self.failures = failures
        self.calls = 0

    def configmap(self, namespace: str, name: str) -> dict[str, Any]:
        self.calls += 1
        if self.failures:
            raise self.failures.pop(0)
        return CONFIGMAP


def test_an_api_server_that_answers_late_is_waited_for(tmp_path: Path) -> None:
    kube = Kube([UpstreamError("no answer"), UpstreamError("no answer")])
    trust = front_proxy_trust(kube, tmp_path / "ca.crt", wait=30, every=0)  # type: ignore[arg-type]
    assert trust is not None and trust.allowed_names == {"front-proxy-client"}
    assert kube.calls == 3
    assert (tmp_path / "ca.crt").read_text() == CONFIGMAP["requestheader-client-ca-file"]


def test_one_that_never_answers_stops_the_agent_instead_of_a_401_for_life(tmp_path: Path) -> None:
    kube = Kube([UpstreamError("no answer")] * 1000)
    with pytest.raises(UpstreamError):
        front_proxy_trust(kube, tmp_path / "ca.crt", wait=0, every=0)  # type: ignore[arg-type]


def test_a_refusal_is_an_answer_the_agent_starts_without_trust(tmp_path: Path) -> None:
    kube = Kube([Forbidden("configmaps is forbidden")])
    assert front_proxy_trust(kube, tmp_path / "ca.crt", wait=30, every=0) is None  # type: ignore[arg-type]
    assert kube.calls == 1
