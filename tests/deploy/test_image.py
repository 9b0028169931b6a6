"""deploy/Dockerfile: what can be checked without a Docker engine.

The Dockerfile is read for what it must say; its install steps are run for real: build
the wheel from a copy of the build context, install it with deploy/install-agent.sh
(the script the Dockerfile runs) into a new venv, start `hotmount-agent` from there and
ask the image's HEALTHCHECK script whether it is healthy.
"""

from __future__ import annotations

import fnmatch
import http.server
import os
import shlex
import shutil
import socket
import subprocess
import sys
import threading
import time
import tomllib
from pathlib import Path

import pytest

from tests.deploy.support import DEPLOY, REPO

DOCKERFILE = DEPLOY / "Dockerfile"
HEALTHCHECK = DEPLOY / "healthcheck.py"
OFFLINE = ("NewConnectionError", "Temporary failure in name resolution", "Network is unreachable")


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    lines = [s for s in DOCKERFILE.read_text().splitlines() if not s.lstrip().startswith("#")]
    joined = "\n".join(lines).replace("\\\n", " ")
    result = []
    for line in joined.splitlines():
        if line.strip():
            word, _, rest = line.strip().partition(" ")
            result.append((word.upper(), rest.strip()))
    return result


def ignore_patterns() -> list[str]:
    text = (DEPLOY / "Dockerfile.dockerignore").read_text().splitlines()
    return [s.strip() for s in text if s.strip() and not s.startswith("#")]


def ignored(relative: str) -> bool:
    parts = relative.split("/")
    for pattern in ignore_patterns():
        bare = pattern.removeprefix("**/")
        if fnmatch.fnmatch(relative, pattern) or any(fnmatch.fnmatch(p, bare) for p in parts):
            return True
    return False


def test_dockerfile_says_what_the_image_needs():
    steps = instructions()
    froms = [args for word, args in steps if word == "FROM"]
    args = dict(a.split("=", 1) for word, a in steps if word == "ARG" and "=" in a)
    assert args["PYTHON_IMAGE"].startswith("python:3.") and "-slim" in args["PYTHON_IMAGE"]
    assert all(f.split()[0] == "${PYTHON_IMAGE}" for f in froms)
    env = " ".join(a for word, a in steps if word == "ENV")
    assert "NVIDIA_VISIBLE_DEVICES=all" in env
    assert "NVIDIA_DRIVER_CAPABILITIES=utility" in env
    assert [a for word, a in steps if word == "USER"] in ([], ["0"], ["root"])
    health = [a for word, a in steps if word == "HEALTHCHECK"]
    assert len(health) == 1 and "healthcheck.py" in health[0]
    assert [a for word, a in steps if word == "ENTRYPOINT"] == ['["hotmount-agent"]']
    run = " ".join(a for word, a in steps if word == "RUN")
    assert "install-agent.sh" in run and "hotmount-agent --help" in run


def test_dockerfile_copies_only_what_a_clone_has():
    for word, args in instructions():
        if word != "COPY" or args.startswith("--from"):
            continue
        *sources, _destination = shlex.split(args)
        for source in sources:
            if source != ".":
                assert (REPO / source).exists(), f"COPY {source}: not in the repository"
                assert not ignored(source), f"COPY {source}: excluded by the .dockerignore"
    for needed in ("pyproject.toml", "hotmount/engine.py", "agent/config.py", "cli"):
        assert not ignored(needed), f"the .dockerignore drops {needed}"
    assert ignored(".venv/bin/python") and ignored(".git/HEAD")


def context_files() -> list[str]:
    """The build context as a fresh clone (plus files not yet committed) gives it."""
    listing = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z"],
        cwd=REPO,
        capture_output=True,
        check=True,
    ).stdout.decode()
    return [f for f in listing.split("\0") if f and not ignored(f) and (REPO / f).is_file()]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run(argv: list[str], **kwargs) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(argv, capture_output=True, text=True, check=False, **kwargs)
    if done.returncode != 0 and any(m in done.stdout + done.stderr for m in OFFLINE):
        pytest.skip(f"no package index reachable for {argv[0]}: {done.stderr[-300:]}")
    assert done.returncode == 0, f"{argv}: {done.stdout[-2000:]}{done.stderr[-2000:]}"
    return done


def test_image_install_steps_give_a_working_agent(tmp_path: Path):
    if shutil.which("git") is None:
        pytest.skip("git is needed to list the build context")
    context = tmp_path / "context"
    for name in context_files():
        (context / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / name, context / name)
    wheels, prefix = tmp_path / "wheels", tmp_path / "opt"
    python = sys.executable
    # The Dockerfile's two steps: `pip wheel --no-deps`, then install-agent.sh.
    run([python, "-m", "pip", "wheel", "-q", "--no-deps", "--wheel-dir", str(wheels), str(context)])
    env = {**os.environ, "PYTHON": python}
    run(["sh", str(DEPLOY / "install-agent.sh"), str(wheels), str(prefix)], env=env)
    agent = prefix / "bin" / "hotmount-agent"

    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    if "hotmount-agent" not in scripts:
        pytest.skip("pyproject.toml has no hotmount-agent script yet: nothing to start")
    assert "--listen" in run([str(agent), "--help"]).stdout
    if not (REPO / "agent" / "main.py").exists():
        pytest.skip("agent/main.py does not exist yet: --help only")

    port = free_port()
    argv = [str(agent), "--no-kubernetes", "--anonymous", "--listen", f"127.0.0.1:{port}"]
    argv += ["--state-dir", str(tmp_path / "state"), "--no-use-nvml"]
    log = (tmp_path / "agent.log").open("w")
    process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    try:
        check_env = {**os.environ, "HOTMOUNT_HEALTHCHECK_URL": f"http://127.0.0.1:{port}/healthz"}
        deadline = time.monotonic() + 30
        while True:
            healthy = subprocess.run(
                [str(prefix / "bin" / "python"), str(HEALTHCHECK)],
                env=check_env,
                capture_output=True,
                check=False,
            )
            if healthy.returncode == 0:
                break
            assert process.poll() is None, (
                f"the agent exited: {(tmp_path / 'agent.log').read_text()}"
            )
            assert time.monotonic() < deadline, healthy.stderr.decode()
            time.sleep(0.3)
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()


class _Health(http.server.BaseHTTPRequestHandler):
    status = 200

    def do_GET(self):
        self.send_response(self.status if self.path == "/healthz" else 404)
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.mark.parametrize(("status", "code"), [(200, 0), (503, 1)])
def test_healthcheck_script(status: int, code: int):
    handler = type("Handler", (_Health,), {"status": status})
    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler) as server:
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            url = f"http://127.0.0.1:{server.server_address[1]}/healthz"
            done = subprocess.run(
                [sys.executable, str(HEALTHCHECK)],
                env={**os.environ, "HOTMOUNT_HEALTHCHECK_URL": url},
                capture_output=True,
                check=False,
            )
        finally:
            server.shutdown()
            thread.join()
    assert done.returncode == code


def test_healthcheck_fails_when_nothing_listens():
    url = f"https://127.0.0.1:{free_port()}/healthz"
    done = subprocess.run(
        [sys.executable, str(HEALTHCHECK)],
        env={**os.environ, "HOTMOUNT_HEALTHCHECK_URL": url},
        capture_output=True,
        check=False,
    )
    assert done.returncode == 1
