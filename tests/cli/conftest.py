"""Fixtures for nvcli's tests: the stub agent, a fake cluster in front of it, nvcli as a process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.agent.conftest import Cluster as RealCluster
from tests.cli.stub_agent import StubAgent
from tests.fakes import AccessRule, CertificateAuthority, FakeKubeApiServer, FrontProxy

AGENT_TOKEN = "agent-token"
NVCLI = Path(sys.executable).parent / "nvcli"


@dataclass
class Run:
    rc: int
    out: str
    err: str

    def json(self) -> object:
        return json.loads(self.out)


@pytest.fixture
def clean_env(tmp_path: Path) -> dict[str, str]:
    """No kubeconfig, no proxies, a private HOME: nothing of the machine leaks in."""
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
    env.pop("KUBECONFIG", None)
    env["HOME"] = str(tmp_path / "home")
    (tmp_path / "home").mkdir(exist_ok=True)
    return env


@pytest.fixture
def nvcli(clean_env: dict[str, str]) -> Callable[..., Run]:
    """nvcli as an operator's shell runs it: the installed console script, a new process."""
    command = [str(NVCLI)] if NVCLI.exists() else [sys.executable, "-m", "cli.main"]

    def run(*args: str, env: dict[str, str] | None = None, timeout: float = 60) -> Run:
        done = subprocess.run(
            [*command, *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            env={**clean_env, **(env or {})},
            stdin=subprocess.DEVNULL,
            check=False,
        )
        return Run(done.returncode, done.stdout, done.stderr)

    return run


@pytest.fixture
def stub() -> Iterator[StubAgent]:
    with StubAgent(token=AGENT_TOKEN) as agent:
        yield agent


@dataclass
class Cluster:
    apiserver: FakeKubeApiServer
    agent: StubAgent
    ca: CertificateAuthority
    directory: Path

    def kubeconfig(self, name: str, namespace: str = "default", **kwargs: object) -> Path:
        return self.apiserver.write_kubeconfig(self.directory / name, namespace=namespace, **kwargs)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    """A fake API server (TLS) whose hotmount.io front proxy reaches the stub agent (TLS)."""
    front_ca = CertificateAuthority(tmp_path / "front", "front-proxy-ca")
    serving_ca = CertificateAuthority(tmp_path / "serving", "agent-serving-ca")
    apiserver = FakeKubeApiServer.with_tls(tmp_path / "pki")
    assert apiserver.ca is not None
    agent = StubAgent(tls=serving_ca.issue_server("agent"), client_ca=front_ca.cert_path)
    with apiserver, agent:
        apiserver.configure_front_proxy(
            FrontProxy(
                backend_url=agent.url,
                client=front_ca.issue_client("front-proxy-client"),
                backend_ca=serving_ca.cert_path,
            )
        )
        apiserver.add_token("alice-token", "alice", ["ml-team"])
        apiserver.allow(AccessRule(group="ml-team", api_group="hotmount.io", namespace="ml"))
        apiserver.allow(
            AccessRule(group="ml-team", api_group="hotmount.io", resource="nodedevices")
        )
        apiserver.allow(
            AccessRule(group="ml-team", api_group="hotmount.io", resource="reassignments")
        )
        yield Cluster(apiserver, agent, apiserver.ca, tmp_path)


@pytest.fixture
def real(tmp_path: Path, rootfs: Path, cdi_dir: Path) -> Iterator[RealCluster]:
    """A real agent process and real runc pods behind the fake API server (tests/agent)."""
    made = RealCluster(tmp_path, rootfs, cdi_dir)
    try:
        yield made
    finally:
        made.close()
