"""A fake cluster around real agents: fake API server and kubelet, real runc containers.

`cluster.pod(name)` starts a runc container and registers a Running pod whose
container ID is that container's; `cluster.agent(node)` starts `hotmount-agent`
as a process for that node. Users: alice (group `ml`, may do anything with
gpumounts in `default`), bob (no rights); the agents' own ServiceAccount token.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fakes.kube_apiserver import AccessRule, FakeKubeApiServer
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


class Cluster:
    def __init__(self, workdir: Path, rootfs: Path, cdi_dir: Path) -> None:
        self.workdir, self.rootfs, self.cdi_dir = workdir, rootfs, cdi_dir
        self.kubelets = {node: FakePodResourcesServer().start() for node in ("node-a", "node-b")}
        self.kube = FakeKubeApiServer(
            nodes={"node-a": [g.uuid for g in GPUS], "node-b": []},
            podresources=self.kubelets,
        ).start()
        self.kube.add_token(AGENT_TOKEN, AGENT_USER, ["system:serviceaccounts"])
        self.kube.allow_auth_delegation(AGENT_USER)
        for resource in ("pods", "events", "configmaps"):
            self.kube.allow(AccessRule(user=AGENT_USER, resource=resource))
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
        self.kubeconfig = self.kube.write_kubeconfig(
            workdir / "agent.kubeconfig", token=AGENT_TOKEN
        )
        self.driver = write_driver_tree(workdir / "driver")
        self.containers: list[RuncContainer] = []
        self.agents: list[AgentProcess] = []

    def pod(
        self, name: str, mode: str = "v1", namespace: str = "default", node: str = "node-a"
    ) -> RuncContainer:
        container = RuncContainer(self.workdir, self.rootfs, mode)
        self.containers.append(container)
        self.kube.put_pod(pod_manifest(name, container, namespace, node))
        return container

    def agent(
        self, node: str = "node-a", state: str | None = None, extra: list[str] | None = None
    ) -> AgentProcess:
        port = free_port()
        state_dir = self.workdir / (state or f"state-{node}")
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
            "http",
            "--authz-cache-ttl",
            "0",
            *(extra or []),
        ]
        agent = AgentProcess(self.workdir, self.driver, args, port)
        self.agents.append(agent)
        self.kube.put_pod(agent_pod_manifest(node, port))
        return agent

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
