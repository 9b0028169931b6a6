"""Forward a request for a pod on another node to the agent on that node.

A platform can then call one Service name. Every agent reaches every other, so a token
sent to another agent is a token that root on that node holds. A bearer caller's own
token therefore goes with the request only when it is bound to the agents' audience
(--token-audiences, and those audiences do not admit the API server's own tokens): then
it opens nothing but the agents, and the receiving agent reviews and authorizes it
itself, as if called directly. Otherwise (the default: a token good for the whole API
server), and for front-proxy callers, who have no token to forward, the forwarding agent
authenticates with its own ServiceAccount token and asserts the user in
`X-Hotmount-User`/`-Group`/`-Uid`/`-Extra-*` (everything a SubjectAccessReview takes,
less the privileged groups receiving agents refuse); the receiving agent accepts such
assertions only from the agents' ServiceAccount, authorizes the asserted user itself,
and refuses privileged identities, `force` and interface moves for them (agent/auth/).
Every call has a timeout: a hung agent costs the caller `agent_timeout`, never a worker
for good. A request that was already forwarded (`X-Hotmount-Forwarded`) is never
forwarded again (no loops), and node-local root callers (the unix socket) act on their
own node only. Lists send the same credentials to every agent they ask.

A list asks every other agent at once, within bounds of its own (`fan_out`): at most
--fanout-concurrency agents in flight (shared by all lists), --list-timeout for each,
--list-deadline for the whole, over keep-alive connections reused from list to list.
What did not answer is named (agent/cluster/fanout.py), never silently left out. Each answer is
read within a byte cap and its deadline, and believed only once validated as the peer's
own node's objects (agent/cluster/peer_answers.py); one caller may have at most
--max-lists-per-caller lists fanning out at once (then 429), so that a few dozen calls
from one token cannot fill the agent's request, thread and fan-out pools.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import ssl
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any

import httpx

from agent.auth.assertion import assertion_headers
from agent.auth.identity import Identity
from agent.cluster.fanout import MissingNode, error_reason, plan, status_reason
from agent.cluster.peer_answers import PeerAnswerError, ReadBounds, peer_items, read_answer
from agent.config import AgentSettings
from agent.errors import Forbidden, NotOnThisNode, TooManyRequests, UpstreamError
from agent.kube.client import KubeClient, PodInfo
from agent.kube.peers import Peer, agent_peers, gpu_nodes

log = logging.getLogger(__name__)
LOCAL_ONLY = "x-hotmount-local"
FORWARDED = "x-hotmount-forwarded"  # one hop only: the receiving agent never forwards it
NODE_LOCAL = ("unix", "anonymous", "static-token")  # identities never asserted to other agents
GPU_NODES_TTL = 60.0  # seconds the list of GPU nodes (for nodes with no agent) is kept


@dataclass
class FanOut:
    """The other agents' items for one list (validated, agent/cluster/peer_answers.py), and the
    nodes that gave none."""

    items: list[dict[str, Any]] = field(default_factory=list)
    answered: list[str] = field(default_factory=list)  # the nodes the items came from
    missing: list[MissingNode] = field(default_factory=list)


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
        # Lists: their own timeout, and one small client per agent, kept between lists for
        # its keep-alive connection. One client for all would do, but its pool looks at every
        # idle connection (a poll each) for every request: quadratic at 500 agents.
        self._list_tls = (
            verify if isinstance(verify, ssl.SSLContext) else httpx.create_ssl_context()
        )
        self._list_clients: dict[str, httpx.Client] = {}
        self._list_clients_lock = threading.Lock()
        self._pool = ThreadPoolExecutor(settings.fanout_concurrency, "fan-out")
        self._gpu_nodes: tuple[float, set[str]] | None = None
        self._gpu_nodes_lock = threading.Lock()
        self._lists_per_caller: dict[str, int] = {}  # user: lists fanning out now
        self._lists_per_caller_lock = threading.Lock()
        self._bound_audiences: bool | None = None  # see _forwards_tokens
        self._bound_audiences_lock = threading.Lock()

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._http.close()
        with self._list_clients_lock:
            clients, self._list_clients = list(self._list_clients.values()), {}
        for one in clients:
            one.close()

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

    def fan_out(self, caller: Identity, path: str) -> FanOut:
        """GET `path` from every other agent at once, each answering for its own node
        only; the nodes that did not answer (or have no agent) are named."""
        if caller.via in ("gateway", *NODE_LOCAL):
            return FanOut()  # node-local callers (root on the unix socket): their node only
        with self._list_slot(caller):
            return self._fan_out(caller, path)

    def _fan_out(self, caller: Identity, path: str) -> FanOut:
        started = time.monotonic()
        deadline = self.settings.list_deadline
        abandoned = threading.Event()  # set when the list stops waiting: late asks stop
        peers = agent_peers(self.kube, self.settings.agent_namespace, self.settings.agent_selector)
        ask, missing = plan(peers, self._recent_gpu_nodes(), self.settings.node_name)
        self._forget_list_clients({self._url(p.ip or "", p.ports, "") for p in ask})
        credentials = self._credentials(caller)
        if credentials is None:  # every other node is missing, for one reason: say it
            lost = "this agent has no ServiceAccount token to ask other agents with"
            missing += [MissingNode(p.node or "", "Unreachable", lost) for p in ask]
            ask = []
        until = started + deadline
        asked: dict[Future[list[dict[str, Any]]], Peer] = {
            self._pool.submit(self._list_one, peer, path, credentials or [], until, abandoned): peer
            for peer in ask
        }
        done, late = wait(asked, timeout=max(until - time.monotonic(), 0))
        abandoned.set()
        result = FanOut(missing=missing)
        for future in late:
            future.cancel()
            late_note = f"no answer within the list's deadline of {deadline:g} s"
            result.missing.append(MissingNode(asked[future].node or "", "Timeout", late_note))
        for future in done:
            node = asked[future].node or ""
            try:
                items = future.result()
            except PeerAnswerError as exc:
                result.missing.append(MissingNode(node, exc.reason, exc.message))
                continue
            except httpx.HTTPError as exc:
                result.missing.append(MissingNode(node, error_reason(exc), str(exc) or repr(exc)))
                continue
            except Exception as exc:  # a pod IP that makes no URL, say: one node, not the list
                result.missing.append(MissingNode(node, "Unreachable", repr(exc)))
                continue
            result.items += items
            result.answered.append(node)
        result.missing.sort(key=lambda m: m.node)
        log.info(
            "listed %s for %s from %d other agents in %.2f s; missing %d nodes: %s",
            path,
            caller.name,
            len(result.answered),
            time.monotonic() - started,
            len(result.missing),
            ", ".join(f"{m.node} ({m.reason})" for m in result.missing[:20]),
        )
        return result

    def _list_one(
        self,
        peer: Peer,
        path: str,
        credentials: list[tuple[str, str]],
        until: float,
        abandoned: threading.Event,
    ) -> list[dict[str, Any]]:
        headers = [*credentials, (LOCAL_ONLY, "1")]
        origin = self._url(peer.ip or "", peer.ports, "")
        client = self._list_client(origin)
        # Its own --list-timeout from when it is asked (it may have waited for a worker),
        # within the list's deadline.
        own = min(until, time.monotonic() + self.settings.list_timeout)
        bounds = ReadBounds(self.settings.list_max_bytes, own, abandoned)
        code, body = read_answer(client, origin + path, headers, self._sni(), bounds)
        reason = status_reason(code)
        if reason is not None:
            raise PeerAnswerError(reason, _status_text(code, body))
        return peer_items(path, peer.node or "", body)

    @contextlib.contextmanager
    def _list_slot(self, caller: Identity) -> Iterator[None]:
        """One of the caller's --max-lists-per-caller fan-outs, or 429."""
        bound = self.settings.max_lists_per_caller
        with self._lists_per_caller_lock:
            held = self._lists_per_caller.get(caller.name, 0)
            if held >= bound:
                raise TooManyRequests(
                    f"{caller.name} already has {bound} lists across the cluster in flight "
                    "on this agent, the limit per caller; retry when one is answered",
                    max(1, math.ceil(self.settings.list_timeout)),
                )
            self._lists_per_caller[caller.name] = held + 1
        try:
            yield
        finally:
            with self._lists_per_caller_lock:
                left = self._lists_per_caller[caller.name] - 1
                if left:
                    self._lists_per_caller[caller.name] = left
                else:
                    del self._lists_per_caller[caller.name]  # none kept per user gone

    def _list_client(self, origin: str) -> httpx.Client:
        with self._list_clients_lock:
            found = self._list_clients.get(origin)
            if found is None:
                found = self._list_clients[origin] = httpx.Client(
                    verify=self._list_tls,
                    timeout=httpx.Timeout(self.settings.list_timeout),
                    limits=httpx.Limits(
                        max_connections=4, max_keepalive_connections=1, keepalive_expiry=120
                    ),
                )
            return found

    def _forget_list_clients(self, keep: set[str]) -> None:
        """Close the clients of agents that are gone (a node removed, a pod moved)."""
        with self._list_clients_lock:
            gone = [o for o in self._list_clients if o not in keep]
            closing = [self._list_clients.pop(o) for o in gone]
        for one in closing:
            one.close()

    def _recent_gpu_nodes(self) -> set[str]:
        """The GPU nodes, listed at most once a minute; none when they cannot be listed
        (then only nodes with an agent pod are named)."""
        with self._gpu_nodes_lock:
            now = time.monotonic()
            if self._gpu_nodes is None or now - self._gpu_nodes[0] > GPU_NODES_TTL:
                try:
                    self._gpu_nodes = (now, gpu_nodes(self.kube, self.settings.gpu_resource))
                except UpstreamError as exc:
                    log.warning("cannot list nodes to name GPU nodes with no agent: %s", exc)
                    self._gpu_nodes = (now, set())
            return self._gpu_nodes[1]

    def _credentials(self, caller: Identity) -> list[tuple[str, str]] | None:
        """A bearer caller's own token where it is bound to the agents' audience: the other
        agent reviews it (its audience, its pod binding) and authorizes that user itself.
        Otherwise (a token good for the API server, or a front-proxy caller) this agent's
        token and the asserted user: the caller's token stays here. None when this agent
        has no token."""
        if caller.bearer and self._forwards_tokens():
            return [("authorization", f"Bearer {caller.bearer}")]
        token = self.kube.token()
        if not token:
            return None
        return [("authorization", f"Bearer {token}"), *assertion_headers(caller.user)]

    def _forwards_tokens(self) -> bool:
        """Whether callers' tokens are bound to the agents alone: --token-audiences is set
        (so every token this agent accepted was reviewed for one of them), and those
        audiences do not admit this agent's own token, which the kubelet minted for the API
        server. Asked once, by a TokenReview; while it cannot be asked, no."""
        audiences = self.settings.token_audiences
        if not audiences:
            return False
        with self._bound_audiences_lock:
            if self._bound_audiences is None:
                own = self.kube.token()
                if not own:
                    return False
                try:
                    admits_api_tokens = self.kube.token_review(own, audiences) is not None
                except (UpstreamError, Forbidden) as exc:
                    log.warning("cannot tell whether callers' tokens may be forwarded: %s", exc)
                    return False
                if admits_api_tokens:
                    log.warning(
                        "--token-audiences %s admit the API server's own tokens (this agent's "
                        "passed a review for them): callers' tokens are never forwarded to "
                        "other agents, their identities are asserted instead",
                        ",".join(audiences),
                    )
                self._bound_audiences = not admits_api_tokens
            return self._bound_audiences

    def _url(self, ip: str, ports: dict[str, int], path: str) -> str:
        port = ports.get("https") or ports.get("http") or self.settings.agent_port
        host = f"[{ip}]" if ":" in ip else ip
        return f"{self.settings.agent_scheme}://{host}:{port}{path}"

    def _sni(self) -> dict[str, Any] | None:
        # The pod IP is not in the agents' certificates; their Service name is.
        if self.settings.agent_scheme == "https":
            return {"sni_hostname": self.settings.agent_server_name}
        return None

    def _send(
        self,
        agent: PodInfo,
        caller: Identity,
        method: str,
        path: str,
        params: list[tuple[str, str]] | None,
        body: Any,
    ) -> httpx.Response:
        credentials = self._credentials(caller)
        if credentials is None:
            raise UpstreamError("this agent has no ServiceAccount token to forward with")
        url = self._url(agent.pod_ip or "", agent.ports, path)
        headers = [*credentials, (FORWARDED, "1")]
        log.info("forwarding %s %s for %s to %s", method, path, caller.name, agent.node_name)
        try:
            return self._http.request(
                method,
                url,
                # A tuple: httpx reads it as the list, and its types take no list[tuple[str, str]].
                params=None if params is None else tuple(params),
                json=body,
                headers=headers,
                extensions=self._sni(),
            )
        except httpx.HTTPError as exc:
            raise UpstreamError(f"forwarding to the agent on {agent.node_name}: {exc}") from exc


def _status_text(code: int, body: bytes) -> str:
    """`HTTP 503: <the Status message>`, or the start of whatever body came."""
    try:
        message = json.loads(body).get("message")
    except (ValueError, AttributeError):
        message = None
    text = message if isinstance(message, str) else body[:200].decode(errors="replace")
    return f"HTTP {code}: {text[:200]}"
