"""A fake cluster around real agents: fake API server and kubelet, real runc containers.

`cluster.pod(name)` starts a runc container and registers a Running pod whose
container ID is that container's; `cluster.agent(node)` starts `hotmount-agent`
as a process for that node. Users: alice (group `ml`, may do anything with
gpumounts in `default`, `force` included, and list nodedevices), bob (no rights); dana,
a namespaced tenant: a RoleBinding in `default` to the shipped ClusterRole
`hotmount-user`; olga, an operator: a ClusterRoleBinding to the shipped `hotmount-admin`;
the agents' own ServiceAccount token; Prometheus' account, a ClusterRoleBinding to the
shipped `hotmount-metrics-reader` (/metrics).
"""

from __future__ import annotations

import itertools
import ssl
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.fakes.kube_apiserver import AccessRule, FakeKubeApiServer, FrontProxy
from tests.fakes.pki import CertificateAuthority, CertPaths
from tests.fakes.podresources_server import FakePodResourcesServer
from tests.support.agent import (
    AGENT_USER,
    GPUS,
    AgentProcess,
    agent_pod_manifest,
    free_port,
    pod_manifest,
    write_driver_tree,
)
from tests.support.runc import RuncContainer

AGENT_TOKEN, ALICE, BOB = "agent-token", "alice-token", "bob-token"
DANA, OLGA = "dana-token", "olga-token"
METRICS = "metrics-token"  # Prometheus' account, bound to the shipped hotmount-metrics-reader
METRICS_USER = "system:serviceaccount:monitoring:prometheus"
USER_ROLES = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes" / "04-rbac-user.yaml"


def shipped_role(name: str) -> dict[str, Any]:
    """A ClusterRole exactly as deploy/kubernetes ships it."""
    roles = [r for r in yaml.safe_load_all(USER_ROLES.read_text()) if r]
    return next(r for r in roles if r["kind"] == "ClusterRole" and r["metadata"]["name"] == name)


@dataclass(frozen=True)
class AggregatedAgent:
    """A TLS agent behind the fake API server's front proxy (an APIService's backend).

    `serving.ca` verifies the agent's serving certificate; `front_proxy` is the API
    server's front-proxy client certificate (CN front-proxy-client), issued by
    `requestheader_ca`, the CA the agent read from extension-apiserver-authentication.
    """

    agent: AgentProcess
    serving: CertPaths
    front_proxy: CertPaths
    requestheader_ca: CertificateAuthority

    def client(self, cert: CertPaths | None = None, **kwargs: Any) -> httpx.Client:
        """Straight to the agent over TLS, presenting `cert` (default: none)."""
        context = ssl.create_default_context(cafile=str(self.serving.ca))
        if cert is not None:
            context.load_cert_chain(str(cert.cert), str(cert.key))
        return httpx.Client(base_url=self.agent.url, verify=context, timeout=60, **kwargs)


class Cluster:
    def __init__(
        self,
        workdir: Path,
        rootfs: Path,
        cdi_dir: Path,
        tls: bool = False,
        gpus: list[str] | None = None,
    ) -> None:
        """`tls`: the API server serves HTTPS (kubectl sends no token over plain HTTP);
        `gpus`: node-a's device plugin's GPUs (default the fixture GPUs' UUIDs)."""
        self.workdir, self.rootfs, self.cdi_dir = workdir, rootfs, cdi_dir
        self._pki_count = itertools.count()
        self.kubelets = {node: FakePodResourcesServer().start() for node in ("node-a", "node-b")}
        pool = [g.uuid for g in GPUS] if gpus is None else gpus
        options: dict[str, Any] = {
            "nodes": {"node-a": pool, "node-b": []},
            "podresources": self.kubelets,
        }
        made = FakeKubeApiServer.with_tls(workdir / "kube-pki", **options) if tls else None
        self.kube = (made or FakeKubeApiServer(**options)).start()
        self.kube.add_token(AGENT_TOKEN, AGENT_USER, ["system:serviceaccounts"])
        self.kube.allow_auth_delegation(AGENT_USER)
        for resource in ("pods", "events", "configmaps", "nodes"):
            self.kube.allow(AccessRule(user=AGENT_USER, resource=resource))
        for resource in ("resourceslices", "resourceclaims"):
            self.kube.allow(
                AccessRule(user=AGENT_USER, api_group="resource.k8s.io", resource=resource)
            )
        self.kube.add_token(ALICE, "alice", ["ml"])
        self.kube.add_token(BOB, "bob", [])
        self.kube.allow(
            AccessRule(
                group="ml", api_group="hotmount.io", resource="gpumounts", namespace="default"
            )
        )
        self.kube.allow(
            AccessRule(
                group="ml",
                api_group="hotmount.io",
                resource="gpumounts",
                verb="list",
                namespace="*",
            )
        )
        self.kube.allow(
            AccessRule(group="ml", api_group="hotmount.io", resource="nodedevices", verb="list")
        )
        self.kube.add_token(DANA, "dana", ["team-a"])
        self.kube.bind_role(shipped_role("hotmount-user"), user="dana", namespace="default")
        self.kube.add_token(OLGA, "olga", ["ops"])
        self.kube.bind_role(shipped_role("hotmount-admin"), group="ops")
        self.kube.add_token(METRICS, METRICS_USER, ["system:serviceaccounts"])
        self.kube.bind_role(shipped_role("hotmount-metrics-reader"), user=METRICS_USER)
        self.kubeconfig = self.kube.write_kubeconfig(
            workdir / "agent.kubeconfig", token=AGENT_TOKEN
        )
        self.driver = write_driver_tree(workdir / "driver")
        self.containers: list[RuncContainer] = []
        self.agents: list[AgentProcess] = []

    def pod(
        self,
        name: str,
        mode: str = "v1",
        namespace: str = "default",
        node: str = "node-a",
        nofile: int | None = None,
        annotations: dict[str, str] | None = None,
        private_tmp: bool = False,
    ) -> RuncContainer:
        """`nofile`: the container's RLIMIT_NOFILE (default runc's 1024); `private_tmp`: a
        /tmp of its own (the stand-in CUDA process keeps its socket and status there)."""
        container = RuncContainer(
            self.workdir, self.rootfs, mode, nofile=nofile, private_tmp=private_tmp
        )
        self.containers.append(container)
        manifest = pod_manifest(name, container, namespace, node, annotations=annotations)
        self.kube.put_pod(manifest)
        return container

    def agent(
        self,
        node: str = "node-a",
        state: str | None = None,
        extra: list[str] | None = None,
        *,
        port: int | None = None,
        tls: CertPaths | None = None,
        driver: Path | None = None,
        env: dict[str, str] | None = None,
        proc_devices: Path | None = None,
    ) -> AgentProcess:
        """Start an agent for `node`. `port`: when the caller must know it beforehand
        (a front proxy configured before the agent starts); `tls`: serve HTTPS with
        this certificate (and forward to other agents over HTTPS); `driver`, `env`,
        `proc_devices`: another /proc/driver tree, environment, /proc/devices (MIG)."""
        port = port or free_port()
        state_dir = self.workdir / (state or f"state-{node}")
        scheme = "https" if tls is not None else "http"
        tls_args = ["--tls-cert", str(tls.cert), "--tls-key", str(tls.key)] if tls else []
        args = [
            "--listen",
            f"127.0.0.1:{port}",
            "--kubeconfig",
            str(self.kubeconfig),
            "--node-name",
            node,
            "--podresources-socket",
            self.kubelets[node].socket_path,
            "--cdi-dir",
            str(self.cdi_dir),
            "--state-dir",
            str(state_dir),
            "--no-use-nvml",
            "--reconcile-interval",
            "1",
            "--holder-timeout",
            "10",
            "--stop-grace",
            "1",
            "--agent-scheme",
            scheme,
            *tls_args,
            "--authz-cache-ttl",
            "0",
            *(extra or []),
        ]
        verify: ssl.SSLContext | bool = False
        if tls is not None:
            verify = ssl.create_default_context(cafile=str(tls.ca))
        agent = AgentProcess(
            self.workdir,
            driver or self.driver,
            args,
            port,
            scheme,
            verify,
            env=env,
            proc_devices=proc_devices,
        )
        self.agents.append(agent)
        self.kube.put_pod(agent_pod_manifest(node, port))
        return agent

    def aggregated_agent(
        self,
        node: str = "node-a",
        extra: list[str] | None = None,
        env: dict[str, str] | None = None,
    ) -> AggregatedAgent:
        """A TLS agent registered as the API server's `hotmount.io` backend (`env`: as
        for `agent`).

        The front proxy is configured before the agent starts: the agent reads the
        request-header CA from kube-system/extension-apiserver-authentication at startup.
        """
        pki = self.workdir / f"pki-{next(self._pki_count)}"
        serving = CertificateAuthority(pki / "serving", "agent-serving-ca").issue_server("agent")
        requestheader_ca = CertificateAuthority(pki / "requestheader", "requestheader-ca")
        front_proxy = requestheader_ca.issue_client("front-proxy-client")
        port = free_port()
        self.kube.configure_front_proxy(
            FrontProxy(
                backend_url=f"https://127.0.0.1:{port}", client=front_proxy, backend_ca=serving.ca
            )
        )
        agent = self.agent(node, extra=extra, port=port, tls=serving, env=env)
        return AggregatedAgent(agent, serving, front_proxy, requestheader_ca)

    def api(self, token: str | None = None) -> httpx.Client:
        """A client of the (fake) API server, with `token` as its bearer credential."""
        headers = {"authorization": f"Bearer {token}"} if token else {}
        ca = self.kube.ca
        verify = ssl.create_default_context(cafile=str(ca.cert_path)) if ca else True
        return httpx.Client(base_url=self.kube.url, headers=headers, timeout=60, verify=verify)

    def events(self, reason: str) -> list[dict[str, Any]]:
        return [e for e in self.kube.events() if e.get("reason") == reason]

    def close(self) -> None:
        for agent in self.agents:
            agent.stop()
        for container in self.containers:
            container.stop()
        self.kube.stop()
        for kubelet in self.kubelets.values():
            kubelet.stop()


@pytest.fixture
def cluster(tmp_path: Path, rootfs: Path, cdi_dir: Path) -> Iterator[Cluster]:
    made = Cluster(tmp_path, rootfs, cdi_dir)
    try:
        yield made
    finally:
        made.close()
