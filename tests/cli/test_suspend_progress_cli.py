"""`nvcli suspend` and `nvcli resume` show progress on a terminal (issue 33): a real agent
with the stand-in driver whose checkpoints and restores wait at gates the test opens
(tests/support/suspend_world.py's `gated`), nvcli as a process whose stderr is a
pseudo-terminal. With `-o json` the same terminal stays quiet."""

from __future__ import annotations

import json
import os
import subprocess
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.agent.conftest import ALICE, OLGA
from tests.cli.conftest import NVCLI
from tests.support.suspend_world import (  # noqa: F401 (fixtures)
    PODS,
    World,
    gated_fixture,
    gates_fixture,
    standin_fixture,
)
from tests.support.waiting import wait_for

pytestmark = pytest.mark.kernel


class Terminal:
    """nvcli run with its stderr on a pseudo-terminal (stdout a pipe): what a user sees."""

    def __init__(self, args: list[str], env: dict[str, str]) -> None:
        command = [str(NVCLI)] if NVCLI.exists() else ["python", "-m", "cli.main"]
        master, slave = os.openpty()
        self.proc = subprocess.Popen(
            [*command, *args], stdout=subprocess.PIPE, stderr=slave, stdin=subprocess.DEVNULL,
            env=env, text=True,
        )  # fmt: skip
        os.close(slave)
        self._master = master
        self._seen: list[bytes] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        while True:
            try:
                chunk = os.read(self._master, 4096)
            except OSError:  # EIO: the process and its terminal are gone
                return
            if not chunk:
                return
            self._seen.append(chunk)

    @property
    def screen(self) -> str:
        return b"".join(self._seen).decode(errors="replace")

    def lines(self) -> list[str]:
        """The lines written, the spinner's frames (`\\r...`) left out."""
        text = self.screen.replace("\r\n", "\n")  # the terminal's own line ends
        return [part.split("\r")[-1].removeprefix("\x1b[K") for part in text.split("\n")]

    def finish(self) -> tuple[int, str]:
        out, _ = self.proc.communicate(timeout=60)
        self._reader.join(timeout=10)
        os.close(self._master)
        return self.proc.returncode, out


@contextmanager
def terminal(args: list[str], env: dict[str, str]) -> Iterator[Terminal]:
    made = Terminal(args, env)
    try:
        yield made
    finally:
        if made.proc.poll() is None:
            made.proc.kill()
            made.proc.communicate()


def shows(term: Terminal, line: str) -> Callable[[], bool]:
    return lambda: line in term.lines()


CHECKPOINTED = "suspend: checkpointed {}/2 processes, {} of 1.0 GiB moved to host memory"
RESTORED = "resume: restored {}/2 processes, {} of 1.0 GiB moved back to GPU memory"


def test_a_terminal_shows_the_counts_grow(
    gated: World, gates: Path, clean_env: dict[str, str]
) -> None:
    container, pid = gated.notebook()
    first, second = gated.second_process(container, pid)
    flags = ["--agent", gated.agent.url, "--token", ALICE, "-n", "default", "--name", "nb"]

    with terminal(["suspend", *flags], clean_env) as term:
        wait_for(
            shows(term, CHECKPOINTED.format(0, "0 MiB")),
            "the first progress line, both processes locked",
            show=term.lines,
        )
        (gates / f"checkpoint-{first}").touch()
        wait_for(
            shows(term, CHECKPOINTED.format(1, "512 MiB")),
            "the count and the memory moved growing",
            show=term.lines,
        )
        (gates / f"checkpoint-{second}").touch()
        rc, out = term.finish()
    assert rc == 0, term.screen
    assert out.strip().startswith("suspended ") and "2 processes kept, 1024 MiB" in out

    with terminal(["resume", *flags], clean_env) as term:
        wait_for(
            shows(term, RESTORED.format(0, "0 MiB")),
            "the resume's first line",
            show=term.lines,
        )
        (gates / f"restore-{first}").touch()
        wait_for(
            shows(term, RESTORED.format(1, "512 MiB")),
            "the resume's count growing",
            show=term.lines,
        )
        (gates / f"restore-{second}").touch()
        rc, out = term.finish()
    assert rc == 0, term.screen
    assert "2 processes restored" in out
    assert progress_polls(gated, "alice")  # what the -o json run below must not do


def progress_polls(world: World, user: str) -> list[str]:
    """The agent's access log: GET .../nb/suspend|resume asked by `user`."""
    found = []
    for line in world.agent.log.read_text().splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        path = str(entry.get("path"))
        if (
            entry.get("method") == "GET"
            and entry.get("user") == user
            and (path.endswith(("/pods/nb/suspend", "/pods/nb/resume")))
        ):
            found.append(path)
    return found


def test_json_on_a_terminal_prints_the_result_alone(
    gated: World, gates: Path, clean_env: dict[str, str]
) -> None:
    """Held part-way (one process checkpointed, the other at its gate) until the agent
    says the suspend has run for 2 s (four polls' worth): nvcli asked for no progress,
    and the terminal shows nothing. The test watches as olga, so that every GET by
    alice in the agent's log is nvcli's."""
    container, pid = gated.notebook()
    first, second = gated.second_process(container, pid)
    flags = ["--agent", gated.agent.url, "--token", ALICE, "-n", "default", "--name", "nb"]

    with terminal(["suspend", "-o", "json", *flags], clean_env) as term:
        (gates / f"checkpoint-{first}").touch()
        with gated.agent.client(OLGA) as api:
            wait_for(
                lambda: (
                    (p := api.get(f"{PODS}/nb/suspend").json())["checkpointed"] == 1
                    and p["elapsedSeconds"] >= 2
                ),
                "one process checkpointed, 2 s into the suspend",
            )
        assert term.screen == ""
        (gates / f"checkpoint-{second}").touch()
        rc, out = term.finish()
    assert rc == 0, term.screen
    assert term.screen == "" and progress_polls(gated, "alice") == []
    assert json.loads(out)["hostBytes"] == 1024 << 20
