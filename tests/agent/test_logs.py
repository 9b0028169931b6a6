"""Every log line once: the agent as a process, with a TCP and a unix listener (as the
DaemonSet runs it), its stderr counted line by line."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import httpx
import pytest

from tests.support.agent import standalone_agent, write_driver_tree

pytestmark = pytest.mark.kernel


def test_each_line_is_logged_once(tmp_path: Path, cdi_dir: Path) -> None:
    socket_path = tmp_path / "run" / "agent.sock"
    agent = standalone_agent(
        tmp_path,
        write_driver_tree(tmp_path / "driver"),
        cdi_dir,
        ["--listen", f"unix:{socket_path}"],
    )
    try:
        transport = httpx.HTTPTransport(uds=str(socket_path))
        with httpx.Client(transport=transport, base_url="http://agent", timeout=60) as local:
            answer = local.get("/v1/devices", headers={"x-request-id": "count-me"})
            assert answer.status_code == 200, answer.text
    finally:
        agent.stop()
    assert agent.process.returncode == 0

    raw = agent.log.read_text().splitlines()
    entries = [json.loads(line) for line in raw]  # every line is one JSON object
    access = [e for e in entries if e.get("requestId") == "count-me"]
    assert [e["logger"] for e in access] == ["hotmount.audit", "hotmount.access"], access

    lines = Counter((e["logger"], e["msg"]) for e in entries if e["logger"] != "hotmount.access")
    repeated = {line: n for line, n in lines.items() if n > 1}
    assert not repeated, repeated
    messages = [e["msg"] for e in entries]
    for once in ("Started server process", "Shutting down", "Finished server process"):
        assert sum(m.startswith(once) for m in messages) == 1, messages
