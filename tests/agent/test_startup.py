"""Settings that would open the agent up are refused at startup, with exit code 2.

An empty (or blank) `--token-file` would make the empty token the password; a
missing one would leave the agent with no token at all. Both are refused like any
other bad setting (a bad `--listen` too): one line naming the setting, exit code 2.
Runs the real `hotmount-agent` process; it stops before touching the host.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest


def start(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "agent.main", "--no-kubernetes", *args],
        capture_output=True,
        text=True,
        # A hang, not a slow start: a loaded cold CI run (load 9) took over 60 s.
        timeout=240,
        check=False,
        cwd=Path(__file__).resolve().parents[2],
    )


@pytest.mark.parametrize("content", ["", "\n", "  \t\n\n"], ids=["empty", "newline", "blank"])
def test_an_empty_token_file_is_refused(tmp_path: Path, content: str) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(content)
    done = start("--listen", "127.0.0.1:0", "--token-file", str(token_file))
    assert done.returncode == 2, done.stderr
    assert f"hotmount-agent: token_file: Value error, {token_file} is empty" in done.stderr


def test_a_missing_token_file_is_refused(tmp_path: Path) -> None:
    done = start("--token-file", str(tmp_path / "absent"))
    assert done.returncode == 2, done.stderr
    assert "token_file" in done.stderr and "No such file or directory" in done.stderr


def test_other_bad_settings_exit_the_same_way() -> None:
    done = start("--listen", "no-port-here")
    assert done.returncode == 2, done.stderr
    assert "hotmount-agent: listen" in done.stderr
