"""Which nodes a list asks, which it names as missing and why (agent/cluster/fanout.py; pure)."""

from __future__ import annotations

import socket
import ssl
import threading

import httpx
import pytest

from agent.cluster.fanout import WARNINGS_SHOWN, MissingNode, error_reason, missing_warnings, plan
from agent.kube.peers import Peer
from tests.support.ports import free_port


def peer(node: str, ip: str | None = "10.0.0.1", phase: str = "Running", pod: str = "") -> Peer:
    return Peer(node=node, pod=pod or f"agent-{node}", ip=ip, phase=phase)


def test_one_running_agent_per_other_node_is_asked() -> None:
    ask, missing = plan(
        [
            peer("here"),
            peer("b", pod="old", phase="Pending", ip=None),
            peer("b", pod="new"),
            peer("c"),
            peer("c", pod="second"),
        ],
        gpu_nodes=["here", "b", "c"],
        here="here",
    )
    assert sorted((p.node, p.pod) for p in ask) == [("b", "new"), ("c", "agent-c")]
    assert missing == []


def test_nodes_without_a_running_agent_are_named() -> None:
    ask, missing = plan(
        [peer("pending", phase="Pending", ip=None), peer("failed", phase="Failed")],
        gpu_nodes=["bare", "pending", "here"],
        here="here",
    )
    assert ask == []
    assert [(m.node, m.reason) for m in missing] == [
        ("failed", "NoAgent"),
        ("pending", "NoAgent"),
        ("bare", "NoAgent"),
    ]
    assert "Pending, with no pod IP" in missing[1].message
    assert missing[2].message == "the node has GPUs and no agent pod"


def test_a_node_without_gpus_or_agent_is_not_missing() -> None:
    assert plan([], gpu_nodes=[], here="here") == ([], [])


def test_a_refused_connection_is_refused() -> None:
    with pytest.raises(httpx.HTTPError) as err:
        httpx.get(f"http://127.0.0.1:{free_port()}/", timeout=5)
    assert error_reason(err.value) == "Refused"


def test_a_failed_handshake_is_a_tls_error() -> None:
    """An agent that speaks plain HTTP where TLS is expected: a real handshake failure."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        port = server.getsockname()[1]

        def plain_answer() -> None:
            conn, _ = server.accept()
            with conn:
                conn.recv(4096)
                conn.sendall(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n")

        thread = threading.Thread(target=plain_answer, daemon=True)
        thread.start()
        with pytest.raises(httpx.HTTPError) as err:
            httpx.get(f"https://127.0.0.1:{port}/", timeout=5, verify=ssl.create_default_context())
        thread.join(5)
    assert error_reason(err.value) == "TLSError"


def test_timeouts_and_the_rest() -> None:
    request = httpx.Request("GET", "https://10.0.0.1/")
    assert error_reason(httpx.ReadTimeout("slow", request=request)) == "Timeout"
    assert error_reason(httpx.ConnectTimeout("slow", request=request)) == "Timeout"
    assert error_reason(httpx.ReadError("reset", request=request)) == "Unreachable"


def test_warnings_are_capped_and_header_safe() -> None:
    many = [MissingNode(f"n{i}", "Timeout", 'said "no"\n') for i in range(WARNINGS_SHOWN + 5)]
    warnings = missing_warnings(many)
    assert len(warnings) == WARNINGS_SHOWN + 1
    assert warnings[0] == '299 - "node n0 did not answer (Timeout): said \\"no\\"?"'
    assert warnings[-1] == '299 - "5 more nodes did not answer (metadata.missingNodes)"'
    assert all("\n" not in w for w in warnings)
