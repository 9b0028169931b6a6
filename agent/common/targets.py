"""Which containers a request means: a pod (and container names, or `*`) resolved to
running containers on this node, and the `shareWith` group a mount may share with."""

from __future__ import annotations

from dataclasses import dataclass

from agent.common.results import require_kube
from agent.config import AgentSettings
from agent.errors import BadRequest, NotOnThisNode, PodNotFound, PodNotRunning
from agent.kube.client import ContainerInfo, KubeClient, PodInfo
from hotmount.wire.schemas import MountRequest


@dataclass(frozen=True)
class Targets:
    settings: AgentSettings
    kube: KubeClient | None

    def container(
        self, namespace: str, pod: str, container: str | None, found: PodInfo | None = None
    ) -> tuple[PodInfo, ContainerInfo]:
        """`found`: the pod as the route's placement looked it up, on this node."""
        info = found or self.node_check(namespace, pod)
        if info.phase != "Running":
            raise PodNotRunning(f"pod {namespace}/{pod} is {info.phase}, not Running")
        chosen = info.container(container)
        if chosen is None:
            names = ", ".join(c.name for c in info.containers)
            raise PodNotFound(f"pod {namespace}/{pod} has no container {container!r} ({names})")
        if not chosen.running or not chosen.container_id:
            raise PodNotRunning(f"container {chosen.name} of pod {namespace}/{pod} is not running")
        return info, chosen

    def node_check(self, namespace: str, pod: str) -> PodInfo:
        """The pod exists and lives on this node (any phase)."""
        info = self.locate(namespace, pod)
        if not self.here(info):
            raise NotOnThisNode(
                f"pod {namespace}/{pod} runs on node {info.node_name}", info.node_name or ""
            )
        return info

    def locate(self, namespace: str, pod: str) -> PodInfo:
        """The pod, wherever it runs (PodNotFound when there is none)."""
        return require_kube(self.kube).get_pod(namespace, pod)

    def here(self, info: PodInfo) -> bool:
        """Whether the pod is this node's (an agent that knows no node name takes all)."""
        return not (
            info.node_name and self.settings.node_name and info.node_name != self.settings.node_name
        )

    def containers(
        self, namespace: str, pod: str, names: list[str | None], found: PodInfo | None = None
    ) -> tuple[PodInfo, list[ContainerInfo]]:
        """The running containers a mount names: one, several, or `*` for all of them."""
        first_name = None if names == ["*"] else names[0]
        info, first = self.container(namespace, pod, first_name, found)
        chosen = list(info.containers) if names == ["*"] else [first]
        for name in names[1:]:
            other = info.container(name)
            if other is None:
                have = ", ".join(c.name for c in info.containers)
                raise PodNotFound(f"pod {namespace}/{pod} has no container {name!r} ({have})")
            chosen.append(other)
        for container in chosen:
            if not container.running or not container.container_id:
                raise PodNotRunning(
                    f"container {container.name} of pod {namespace}/{pod} is not running"
                )
        return info, chosen

    def share_group(self, target: PodInfo, request: MountRequest) -> str | None:
        """`shareWith`: a pod of the target's own namespace (never another's), by name."""
        other = request.share_with
        if other is None:
            return None
        if request.count is not None:
            raise BadRequest("shareWith shares named devices; a count gets fresh ones")
        if other == target.name:
            raise BadRequest(
                "shareWith names another pod; the containers of one pod share without it"
            )
        require_kube(self.kube).get_pod(target.namespace, other)  # 404 for a pod that is not there
        return f"{target.namespace}/{other}"
