"""Forward a request for a pod on another node to the agent on that node.

A platform can then call one Service name. The forwarding agent authenticates
with its own ServiceAccount token and asserts the original user in
`X-Hotmount-User`/`-Group`/`-Uid`/`-Extra-*` (everything a SubjectAccessReview takes);
the receiving agent accepts such assertions only from the agents' ServiceAccount and
authorizes the asserted user itself. Every call has a timeout: a hung agent costs
the caller `agent_timeout`, never a worker for good. A request
that was already forwarded is never forwarded again (no loops), and node-local
root callers (the unix socket) act on their own node only.
"""

from __future__ import annotations

import logging
import ssl
from typing import Any

import httpx

from agent.auth import Identity, assertion_headers
from agent.config import AgentSettings
from agent.errors import Forbidden, NotOnThisNode, UpstreamError
from agent.kube.client import KubeClient, PodInfo

log = logging.getLogger(__name__)
LOCAL_ONLY = "x-hotmount-local"
NODE_LOCAL = ("unix", "anonymous", "static-token")  # identities never asserted to other agents


class Gateway:
    def __init__(self, settings: AgentSettings, kube: KubeClient) -> None:
        self.settings = settings
        self.kube = kube
        verify: ssl.SSLContext | bool = (
            ssl.create_default_context(cafile=str(settings.agent_ca)) if settings.agent_ca else True
        )
        # The other agent may itself wait for a holder pod: give it that long and more.
        answer = settings.agent_timeout or settings.holder_timeout + 30
        self._http = httpx.Client(
            verify=verify, timeout=httpx.Timeout(answer, connect=min(answer, 5.0))
        )

    def close(self) -> None:
        self._http.close()

    def forward(
        self,
        caller: Identity,
        node: str,
        method: str,
        path: str,
        params: list[tuple[str, str]] | None = None,
        body: Any = None,
    ) -> httpx.Response:
        if caller.via == "gateway":
            raise NotOnThisNode(
                f"the pod is on node {node}, and this request was forwarded already", node
            )
        if caller.via in NODE_LOCAL:
            raise Forbidden(
                f"the pod is on node {node}; {caller.via} callers act on their own node only"
            )
        agents = [
            a
            for a in self.kube.pods_on_node(
                self.settings.agent_namespace, self.settings.agent_selector, node
            )
            if a.pod_ip and a.phase == "Running"
        ]
        if not agents:
            raise UpstreamError(f"no running gpu-hotmount agent on node {node}")
        return self._send(agents[0], caller, method, path, params, body)

    def fan_out(self, caller: Identity, path: str) -> list[httpx.Response]:
        """GET `path` from every other agent, each answering for its own node only."""
        if caller.via in ("gateway", *NODE_LOCAL):
            return []  # node-local callers (root on the unix socket) see their own node only
        answers = []
        for agent in self.kube.agent_pods(
            self.settings.agent_namespace, self.settings.agent_selector
        ):
            if agent.node_name == self.settings.node_name or not agent.pod_ip:
                continue
            try:
                answers.append(self._send(agent, caller, "GET", path, None, None, local_only=True))
            except UpstreamError as exc:
                log.warning("fan-out to %s failed: %s", agent.node_name, exc.message)
        return answers

    def _send(
        self,
        agent: PodInfo,
        caller: Identity,
        method: str,
        path: str,
        params: list[tuple[str, str]] | None,
        body: Any,
        local_only: bool = False,
    ) -> httpx.Response:
        token = self.kube.token()
        if not token:
            raise UpstreamError("this agent has no ServiceAccount token to forward with")
        port = agent.ports.get("https") or agent.ports.get("http") or self.settings.agent_port
        url = f"{self.settings.agent_scheme}://{agent.pod_ip}:{port}{path}"
        headers = [("authorization", f"Bearer {token}"), *assertion_headers(caller.user)]
        if local_only:
            headers.append((LOCAL_ONLY, "1"))
        log.info("forwarding %s %s for %s to %s", method, path, caller.name, agent.node_name)
        # The pod IP is not in the agents' certificates; their Service name is.
        extensions = (
            {"sni_hostname": self.settings.agent_server_name}
            if self.settings.agent_scheme == "https"
            else None
        )
        try:
            return self._http.request(
                method, url, params=params, json=body, headers=headers, extensions=extensions
            )
        except httpx.HTTPError as exc:
            raise UpstreamError(f"forwarding to the agent on {agent.node_name}: {exc}") from exc
