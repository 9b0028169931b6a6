"""nvcli as a process against a real `hotmount-agent` process, on a fake cluster with runc pods.

The agent (tests/support/agent.py) sees two fixture GPUs: index 0 is minor 3
(/dev/nvidia3), index 1 is minor 1. CDI stand-ins: `nvidia.com/gpu=1` is
/dev/fuse, which a container process can hold open.
"""

from __future__ import annotations

import json
import ssl
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from tests.agent.conftest import ALICE, BOB, Cluster
from tests.cli.conftest import Run
from tests.fakes import CertificateAuthority, FrontProxy
from tests.support.agent import GPUS, AgentProcess, agent_pod_manifest, free_port

pytestmark = pytest.mark.kernel
Nvcli = Callable[..., Run]
GPU1 = "nvidia.com/gpu=1"


def flags(agent: AgentProcess, token: str = ALICE) -> list[str]:
    return ["--agent", agent.url, "--token", token, "-n", "default"]


def test_every_command_against_the_agent(nvcli: Nvcli, real: Cluster) -> None:
    a, b = real.pod("nb-a"), real.pod("nb-b")
    agent = real.agent()
    gpu0 = GPUS[0]

    mounted = nvcli("mount", "--name", "nb-a", "--mount=0", *flags(agent), "-o", "json")
    assert mounted.rc == 0, mounted.err
    body = json.loads(mounted.out)
    assert [d["key"] for d in body["mounted"]] == [gpu0.uuid]
    assert a.open_result(f"/dev/nvidia{gpu0.minor}") == "ENXIO"  # granted, no driver behind

    status = nvcli("status", "--name", "nb-a", *flags(agent), "-o", "yaml")
    assert status.rc == 0, status.err
    assert yaml.safe_load(status.out)["containers"][0]["devices"][0]["key"] == gpu0.uuid

    listing = nvcli("list", *flags(agent))
    assert listing.rc == 0, listing.err
    assert "default/nb-a (main) [hotmount, pin hotmount-pin-nb-a-" in listing.out

    moved = nvcli("move", "--gpu", "0", "--from", "nb-a", "--to", "nb-b", *flags(agent))
    assert moved.rc == 0, moved.err
    assert f"nvidia{gpu0.minor}" not in a.ls_dev()
    assert b.open_result(f"/dev/nvidia{gpu0.minor}") == "ENXIO"

    unmounted = nvcli("unmount", "--name", "nb-b", "--unmount", "0", *flags(agent))
    assert unmounted.rc == 0, unmounted.err
    assert f"nvidia{gpu0.minor}" not in b.ls_dev()


def test_busy_then_force(nvcli: Nvcli, real: Cluster) -> None:
    container = real.pod("nb")
    agent = real.agent()
    assert nvcli("mount", "--name", "nb", "--mount", GPU1, *flags(agent)).rc == 0
    holder = container.hold("/dev/nvidia1")
    try:
        busy = nvcli("unmount", "--name", "nb", "--unmount", GPU1, *flags(agent))
        assert busy.rc == 3, busy.err
        assert "is in use by PID" in busy.err and "retry with --force" in busy.err
        forced = nvcli("unmount", "--name", "nb", "--unmount", GPU1, "--force", *flags(agent),
                       "-o", "json")  # fmt: skip
        assert forced.rc == 0, forced.err
        assert json.loads(forced.out)["stoppedPids"]
    finally:
        holder.kill()
        holder.communicate()


def test_exit_codes_from_the_agent(nvcli: Nvcli, real: Cluster) -> None:
    real.pod("nb")
    agent = real.agent()
    no_pod = nvcli("mount", "--name", "ghost", "--mount", "0", *flags(agent))
    assert no_pod.rc == 4, no_pod.err
    no_device = nvcli("mount", "--name", "nb", "--mount", "nvidia.com/gpu=9", *flags(agent))
    assert no_device.rc == 4, no_device.err
    block = nvcli("mount", "--name", "nb", "--mount", "nvidia.com/gpu=disk", *flags(agent))
    assert block.rc == 2, block.err
    forbidden = nvcli("mount", "--name", "nb", "--mount", "0", *flags(agent, BOB))
    assert forbidden.rc == 5, forbidden.err
    unauthenticated = nvcli("list", *flags(agent, "no-such-token"))
    assert unauthenticated.rc == 5, unauthenticated.err


def test_through_the_api_server_to_the_agent(nvcli: Nvcli, real: Cluster, tmp_path: Path) -> None:
    """The default path: kubeconfig token -> API server -> front-proxy TLS -> the agent."""
    front_ca = CertificateAuthority(tmp_path / "front", "front-proxy-ca")
    serving_ca = CertificateAuthority(tmp_path / "serving", "agent-serving-ca")
    serving = serving_ca.issue_server("agent")
    proxy_client = front_ca.issue_client("front-proxy-client")

    def front_proxy(url: str) -> FrontProxy:
        return FrontProxy(backend_url=url, client=proxy_client, backend_ca=serving_ca.cert_path)

    real.kube.configure_front_proxy(front_proxy("https://127.0.0.1:1"))  # the CA, for the agent
    container = real.pod("nb")
    port = free_port()
    args = [
        "--listen", f"127.0.0.1:{port}", "--kubeconfig", str(real.kubeconfig),
        "--node-name", "node-a", "--podresources-socket", real.kubelets["node-a"].socket_path,
        "--cdi-dir", str(real.cdi_dir), "--state-dir", str(tmp_path / "state-tls"),
        "--no-use-nvml", "--reconcile-interval", "1", "--stop-grace", "1",
        "--authz-cache-ttl", "0", "--tls-cert", str(serving.cert), "--tls-key", str(serving.key),
    ]  # fmt: skip
    trust = ssl.create_default_context(cafile=str(serving_ca.cert_path))
    agent = AgentProcess(real.workdir, real.driver, args, port, "https", trust)
    real.agents.append(agent)
    real.kube.put_pod(agent_pod_manifest("node-a", port))
    real.kube.configure_front_proxy(front_proxy(agent.url))
    config = real.kube.write_kubeconfig(tmp_path / "alice.kubeconfig", token=ALICE)

    mounted = nvcli("mount", "--name", "nb", "--mount", GPU1, "--kubeconfig", str(config),
                    "-o", "json")  # fmt: skip
    assert mounted.rc == 0, mounted.err + agent.log.read_text()[-2000:]
    assert [d["key"] for d in json.loads(mounted.out)["mounted"]] == [GPU1]
    assert container.open_result("/dev/nvidia1") == "OK"

    status = nvcli("status", "--name", "nb", "--kubeconfig", str(config), "-o", "json")
    assert status.rc == 0, status.err
    assert json.loads(status.out)["containers"][0]["devices"][0]["key"] == GPU1

    unmounted = nvcli("unmount", "--name", "nb", "--unmount", GPU1, "--kubeconfig", str(config))
    assert unmounted.rc == 0, unmounted.err
    assert "nvidia1" not in container.ls_dev()

    bob = real.kube.write_kubeconfig(tmp_path / "bob.kubeconfig", token=BOB)
    denied = nvcli("mount", "--name", "nb", "--mount", GPU1, "--kubeconfig", str(bob))
    assert denied.rc == 5, denied.err
