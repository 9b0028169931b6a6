"""The root-only unix socket: never connectable by anyone else, not even for a moment.

By construction: the socket is bound inside a fresh 0700 directory and made 0600
there, then renamed into place; a process running as nobody (uid 65534) cannot
connect at either stage. And on every connection: the agent reads the peer's uid
(SO_PEERCRED), so a socket opened up by hand (chmod 0666) still serves root only.
The directories here are world-searchable (0755, like /run) so that nothing but the
socket's own protection is being tested.
"""

from __future__ import annotations

import os
import shutil
import socket
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from agent.http.server import bind_private, publish
from tests.support.agent import standalone_agent, write_driver_tree

pytestmark = pytest.mark.kernel
NOBODY = 65534
# Debian's own interpreter: nobody can run it (the test's may live under /root).
PYTHON = "/usr/bin/python3"

_CONNECT = """
import errno, socket, sys
s = socket.socket(socket.AF_UNIX)
try:
    s.connect(sys.argv[1])
except OSError as e:
    print(errno.errorcode[e.errno]); sys.exit()
if len(sys.argv) > 2:
    s.sendall(b"GET /v1/devices HTTP/1.1\\r\\nHost: agent\\r\\nConnection: close\\r\\n\\r\\n")
    print(b"".join(iter(lambda: s.recv(65536), b"")).decode())
else:
    print("connected")
"""


def as_nobody(path: Path, request: bool = False) -> str:
    """Connect to `path` as uid/gid 65534 (and send GET /v1/devices); say what happened."""
    args = [PYTHON, "-I", "-c", _CONNECT, str(path), *(["request"] if request else [])]
    done = subprocess.run(
        args,
        user=NOBODY,
        group=NOBODY,
        extra_groups=[],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return done.stdout.strip()


@pytest.fixture
def open_dir() -> Iterator[Path]:
    """A directory anyone may search, like /run."""
    directory = Path(tempfile.mkdtemp(prefix="hotmount-sock-", dir="/tmp"))
    directory.chmod(0o755)
    try:
        yield directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def test_the_socket_is_bound_where_nobody_else_can_reach_it(open_dir: Path) -> None:
    path = open_dir / "agent.sock"
    path.write_text("a stale file from an earlier run")
    sock, staged = bind_private(path)
    try:
        # At bind time (and until the rename) the socket lies in a root-only directory.
        staging = os.stat(staged.parent)
        assert staged.parent.parent == open_dir
        assert (stat.S_IMODE(staging.st_mode), staging.st_uid) == (0o700, 0)
        assert stat.S_IMODE(os.stat(staged).st_mode) == 0o600
        assert as_nobody(staged) == "EACCES"
        assert not stat.S_ISSOCK(os.stat(path).st_mode)  # nothing published yet

        publish(staged, path)
        mode = os.stat(path).st_mode
        assert stat.S_ISSOCK(mode) and stat.S_IMODE(mode) == 0o600
        assert not staged.parent.exists()
        assert as_nobody(path) == "EACCES"
        with socket.socket(socket.AF_UNIX) as root:
            root.connect(str(path))  # the listening socket, now in place
    finally:
        sock.close()


def test_a_non_root_peer_is_refused_even_on_an_open_socket(
    tmp_path: Path, open_dir: Path, cdi_dir: Path
) -> None:
    socket_path = open_dir / "agent.sock"
    agent = standalone_agent(
        tmp_path,
        write_driver_tree(tmp_path / "driver"),
        cdi_dir,
        ["--listen", f"unix:{socket_path}"],
    )
    try:
        assert stat.S_IMODE(socket_path.stat().st_mode) == 0o600
        assert as_nobody(socket_path) == "EACCES"

        socket_path.chmod(0o666)  # a mistake, or a race the old code had
        answer = as_nobody(socket_path, request=True)
        assert answer.startswith("HTTP/1.1 401"), answer
        assert '"reason":"Unauthorized"' in answer and "uid 65534" in answer

        transport = httpx.HTTPTransport(uds=str(socket_path))
        with httpx.Client(transport=transport, base_url="http://agent", timeout=60) as root:
            assert root.get("/v1/devices").status_code == 200
    finally:
        agent.stop()
