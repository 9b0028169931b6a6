"""Usage errors exit 2 (before any request); every command's help shows an example."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.cli.conftest import AGENT_TOKEN, Run
from tests.cli.stub_agent import StubAgent

Nvcli = Callable[..., Run]


@pytest.mark.parametrize("command", ["mount", "unmount", "status", "list", "move", "version"])
def test_help_shows_an_example(nvcli: Nvcli, command: str) -> None:
    run = nvcli(command, "--help")
    assert run.rc == 0
    assert "Example:" in run.out
    assert f"nvcli {command}" in run.out.split("Example:")[1]


def test_top_level_help_and_completion(nvcli: Nvcli) -> None:
    run = nvcli("--help")
    assert run.rc == 0 and "Example:" in run.out
    assert "--install-completion" in run.out and "--show-completion" in run.out
    for command in ("mount", "unmount", "status", "list", "move", "version"):
        assert command in run.out


USAGE_ERRORS = {
    "unknown-flag": ["mount", "--name", "nb-0", "--mount", "0", "--bogus"],
    "unknown-command": ["mountt"],
    "no-devices": ["mount", "--name", "nb-0"],
    "devices-and-count": ["mount", "--name", "nb-0", "--mount", "0", "--count", "1"],
    "count-zero": ["mount", "--name", "nb-0", "--count", "0"],
    "no-name": ["mount", "--mount", "0"],
    "unmount-nothing": ["unmount", "--name", "nb-0"],
    "unmount-both": ["unmount", "--name", "nb-0", "--unmount", "0", "--all"],
    "move-no-gpu": ["move", "--from", "a", "--to", "b"],
    "bad-output": ["list", "-o", "wide"],
    "bad-verbosity": ["list", "--v", "11"],
    "bad-timeout": ["list", "--timeout", "soon"],
    "local-and-agent": ["list", "--local", "--agent", "http://x"],
    "local-with-name": ["mount", "--local", "--name", "nb-0", "--mount", "0"],
    "local-count": ["mount", "--local", "--container", "abc", "--count", "1"],
    "engine-flags-without-local": ["list", "--state-dir", "/tmp/x"],
}


@pytest.mark.parametrize("args", USAGE_ERRORS.values(), ids=USAGE_ERRORS.keys())
def test_usage_errors_exit_2_without_a_request(
    nvcli: Nvcli, stub: StubAgent, args: list[str]
) -> None:
    agent = [] if "--agent" in args else ["--agent", stub.url]
    run = nvcli(*args, *agent, "--token", AGENT_TOKEN)
    assert run.rc == 2, (run.out, run.err)
    assert "Error" in run.err
    assert stub.received == []


def test_token_without_agent_is_a_usage_error(nvcli: Nvcli) -> None:
    run = nvcli("list", "--token", "t")
    assert run.rc == 2 and "--token and --token-file go with --agent URL" in run.err


def test_no_arguments_shows_help(nvcli: Nvcli) -> None:
    run = nvcli()
    assert run.rc in (0, 2) and "Usage:" in (run.out + run.err)
