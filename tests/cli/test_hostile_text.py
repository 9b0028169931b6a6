"""nvcli prints no control characters an agent sent it (cli/output.py, `printable`).

An agent may be compromised (root on its node), and so may whatever it passes on: a
missing node's message is another agent's text. Printed raw, ESC sequences move the
cursor, clear the screen or retitle the terminal, and U+202E turns text around. Through
the fake API server to the stub agent, as nvcli runs for a user.
"""

from __future__ import annotations

from collections.abc import Callable

from cli.output import columns
from tests.cli.conftest import Cluster, Run

Nvcli = Callable[..., Run]
HOSTILE = "\x1b[2J\x1b]0;owned\x07\u202eok\r\nforged line\x9b31m"
RAW = ("\x1b", "\x07", "\u202e", "\r", "\x9b")


def test_a_missing_nodes_escapes_are_printed_as_question_marks(
    nvcli: Nvcli, cluster: Cluster
) -> None:
    cluster.agent.missing_nodes = [
        {"node": "gpu-7\x1b[8m", "reason": "Timeout\x1b[0m", "message": HOSTILE}
    ]
    config = cluster.kubeconfig("config", token="alice-token")
    listed = nvcli("list", "--kubeconfig", str(config))
    assert listed.rc == 0, listed.err
    assert not [c for c in RAW if c in listed.err + listed.out], repr(listed.err)
    (warning,) = listed.err.splitlines()  # one line: the newline did not forge a second
    assert warning.startswith("warning: node gpu-7?[8m did not answer (Timeout?[0m): ")
    assert "?[2J?]0;owned?" in warning


def test_an_agents_error_message_is_printed_as_question_marks(
    nvcli: Nvcli, cluster: Cluster
) -> None:
    cluster.agent.fail(503, "ServiceUnavailable", HOSTILE)
    config = cluster.kubeconfig("config", namespace="ml", token="alice-token")
    run = nvcli("status", "--name", "nb-0", "--kubeconfig", str(config))
    assert run.rc != 0
    assert not [c for c in RAW if c in run.err + run.out], repr(run.err)
    assert "?[2J?]0;owned?" in run.err


def test_a_table_cell_is_one_printable_line() -> None:
    printed = columns(["NAME", "HOLDER"], [["nb\x1b[31m", "a\nFORGED   ROW"]])
    assert printed.splitlines() == ["NAME      HOLDER", "nb?[31m   a?FORGED   ROW"]
