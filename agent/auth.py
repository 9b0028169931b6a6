"""Who is calling, and may they: one authorization model for every entry path.

Authentication, first match wins (agent/guard.py runs it before any body is read):
1. the root-only unix socket: the node's own root. The socket is 0600 from birth
   (agent/server.py), and the peer's uid (SO_PEERCRED) must be root's or the agent's;
2. `X-Remote-User`/`-Group`/`-Extra-*` from the aggregated API's front proxy, trusted
   only with a TLS client certificate verified against the request-header CA and
   carrying one of its allowed names; anything else presenting them gets 401;
3. `Authorization: Bearer`: the standalone token file, or a TokenReview (a refused
   token is remembered briefly, so a flood of bad tokens is not a flood of reviews);
   an agent forwarding a bearer caller's request forwards the caller's own token only
   when it is bound to the agents' audience (--token-audiences; agent/gateway.py), so
   the receiving agent reviews it itself. Other callers (front-proxy callers, who have no
   token to forward, and tokens good for the API server) are asserted: when the token
   belongs to the agents' own ServiceAccount, `X-Hotmount-User`, `-Group`, `-Uid` and
   `-Extra-*` name the user a forwarding agent acts for. Every agent holds that token,
   so root on any node could assert anyone: privileged identities (`system:masters`,
   `system:nodes`, a node's user, the agents' own account) are never believed, and an
   asserted user may not force or move network interfaces unless the operator opted in
   (--allow-asserted-force);
4. otherwise 401, unless anonymous access was configured (development only).

Authorization is a SubjectAccessReview for the user: group `hotmount.io`, resource
`gpumounts` (the node listing: `nodedevices`), the pod's namespace and name; decisions
are cached briefly. A forced operation also needs the verb `force` on each pod it
touches: it overrides another holder's claim, so it is a permission of its own. So does
a suspend that takes GPUs from processes holding them, unless the pod itself asks (a
token bound to it, not an assertion). Every
decision is logged with the user, the verb and the pod. `/metrics` is a SAR for `get` on
the non-resource URL, as the kubelet's and controller-runtime's metrics filters ask.
`--refuse-unbound-service-account-tokens` refuses API calls from ServiceAccount tokens
that name no pod.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, unquote

from cachetools import TTLCache

from agent.config import AgentSettings
from agent.errors import Forbidden, Unauthorized
from agent.kube.client import KubeClient, UserInfo

log = logging.getLogger("hotmount.audit")

API_GROUP = "hotmount.io"
RESOURCE = "gpumounts"
POD_NAME_EXTRA = "authentication.kubernetes.io/pod-name"  # a token bound to a pod
POD_UID_EXTRA = "authentication.kubernetes.io/pod-uid"
SERVICE_ACCOUNT_PREFIX = "system:serviceaccount:"
ASSERT_USER, ASSERT_GROUP = "x-hotmount-user", "x-hotmount-group"
ASSERT_UID, ASSERT_EXTRA = "x-hotmount-uid", "x-hotmount-extra-"
REMOTE_USER, REMOTE_GROUP, REMOTE_EXTRA = "x-remote-user", "x-remote-group", "x-remote-extra-"
# Never believed from an assertion: with them, root on one node would rule every node.
PRIVILEGED_GROUPS = frozenset({"system:masters", "system:nodes"})
PRIVILEGED_USERS = frozenset({"system:apiserver"})
NODE_USER_PREFIX = "system:node:"


@dataclass(frozen=True)
class Identity:
    user: UserInfo
    via: str  # unix | front-proxy | token | gateway | static-token | anonymous
    trusted: bool = False  # node root, static token or anonymous: no SAR
    # The caller's own bearer token (via "token"), forwarded as it came to other agents
    # where it is bound to their audience (agent/gateway.py), else asserted.
    bearer: str | None = field(default=None, repr=False, compare=False)

    @property
    def name(self) -> str:
        return self.user.username

    @property
    def asserted(self) -> bool:
        """Named by another agent, on the strength of the token every agent holds."""
        return self.via == "gateway"


@dataclass(frozen=True)
class CallerContext:
    """What the transport knows: the listener, the verified peer certificate, the headers."""

    headers: Mapping[str, list[str]]
    listener: str  # "unix" or "tcp"
    peer_cert: dict[str, Any] | None = None
    peer_uid: int | None = None  # unix socket: SO_PEERCRED

    def first(self, name: str) -> str | None:
        values = self.headers.get(name)
        return values[0] if values else None


@dataclass(frozen=True)
class FrontProxyTrust:
    """From kube-system/extension-apiserver-authentication."""

    allowed_names: frozenset[str] = field(default_factory=frozenset)

    def allows(self, cert: dict[str, Any] | None) -> bool:
        if not cert:
            return False  # no certificate, or not one the request-header CA signed
        if not self.allowed_names:
            return True  # Kubernetes: an empty list allows any name the CA signed
        names = {
            value for rdn in cert.get("subject", ()) for key, value in rdn if key == "commonName"
        }
        return bool(names & self.allowed_names)


class _TtlCache:
    def __init__(self, ttl: float) -> None:
        self.ttl = ttl
        self._items: dict[Any, tuple[float, Any]] = {}
        self._lock = threading.Lock()

    def get(self, key: Any) -> Any:
        with self._lock:
            item = self._items.get(key)
            if item is None or item[0] < time.monotonic():
                self._items.pop(key, None)
                return None
            return item[1]

    def put(self, key: Any, value: Any) -> None:
        with self._lock:
            if len(self._items) > 4096:
                self._items.clear()
            self._items[key] = (time.monotonic() + self.ttl, value)


class Authenticator:
    def __init__(
        self,
        settings: AgentSettings,
        kube: KubeClient | None,
        front_proxy: FrontProxyTrust | None = None,
    ) -> None:
        self.settings = settings
        self.kube = kube
        self.front_proxy = front_proxy
        self._static_token = (
            settings.token_file.read_text().strip().encode() if settings.token_file else None
        )
        self._reviews = _TtlCache(settings.authz_cache_ttl)
        # Bounded: a flood of distinct bad tokens evicts old refusals, not good users.
        self._refused: TTLCache[str, bool] | None = (
            TTLCache(maxsize=4096, ttl=settings.token_failure_ttl)
            if settings.token_failure_ttl > 0
            else None
        )
        self._refused_lock = threading.Lock()

    def authenticate(self, caller: CallerContext) -> Identity:
        return self._authenticate(caller, may_block=True)

    def authenticate_without_io(self, caller: CallerContext) -> Identity | None:
        """The identity when no API call is needed to know it (the unix socket, the static
        token, a TokenReview still cached, a refusal), for the event loop; None when a
        TokenReview must be asked: then call `authenticate` in a worker thread."""
        try:
            return self._authenticate(caller, may_block=False)
        except _WouldBlock:
            return None

    def _authenticate(self, caller: CallerContext, may_block: bool) -> Identity:
        if caller.listener == "unix":
            if caller.peer_uid not in (0, os.geteuid()):
                raise Unauthorized(
                    f"the unix socket serves root only; this caller runs as uid {caller.peer_uid}"
                )
            return Identity(UserInfo("system:node-local:root", ["system:masters"]), "unix", True)
        if any(name.startswith("x-remote-") for name in caller.headers):
            return self._front_proxy(caller)
        authorization = caller.first("authorization") or ""
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() == "bearer" and token:
            return self._bearer(token.strip(), caller, may_block)
        if caller.first(ASSERT_USER):
            raise Unauthorized("identity assertions are accepted only from the agents")
        if self.settings.anonymous:
            return Identity(
                UserInfo("system:anonymous", ["system:unauthenticated"]), "anonymous", True
            )
        raise Unauthorized("no credentials: send Authorization: Bearer <token>")

    def _front_proxy(self, caller: CallerContext) -> Identity:
        if self.front_proxy is None or not self.front_proxy.allows(caller.peer_cert):
            raise Unauthorized(
                "X-Remote-* headers are accepted only with the API server's front-proxy "
                "client certificate"
            )
        user = caller.first(REMOTE_USER)
        if not user:
            raise Unauthorized("the front proxy sent no X-Remote-User")
        groups = list(caller.headers.get(REMOTE_GROUP, []))
        # Kubernetes percent-encodes extra keys in header names (`a.io%2fpod-name`).
        extra = {
            unquote(name[len(REMOTE_EXTRA) :]): list(values)
            for name, values in caller.headers.items()
            if name.startswith(REMOTE_EXTRA)
        }
        return Identity(UserInfo(user, groups, "", extra), "front-proxy")

    def _bearer(self, token: str, caller: CallerContext, may_block: bool) -> Identity:
        if self._static_token is not None:
            if hmac.compare_digest(token.encode(), self._static_token):
                return Identity(UserInfo("static-token", []), "static-token", True)
            raise Unauthorized("the bearer token is not valid")
        if self.kube is None:
            raise Unauthorized("no way to check a bearer token in this mode (no --token-file)")
        asserted = caller.first(ASSERT_USER)
        audiences = self.settings.token_audiences
        user = self._reviewed(token, audiences, may_block)
        if user is None and asserted and audiences:
            # The agents' own token is the kubelet's, minted for the API server's audience,
            # not for --token-audiences: an assertion is reviewed for that audience, and
            # believed only from the agents' account (checked below).
            user = self._reviewed(token, [], may_block)
        if user is None:
            raise Unauthorized("the bearer token is not valid for this audience")
        if asserted:
            if user.username != self.settings.agent_user:
                raise Unauthorized("identity assertions are accepted only from the agents")
            named = asserted_user(asserted, caller.headers)
            refuse_privileged_assertion(named, self.settings.agent_user)
            return Identity(named, "gateway")
        return Identity(user, "token", bearer=token)

    def _reviewed(self, token: str, audiences: list[str], may_block: bool) -> UserInfo | None:
        """The token's user for `audiences` (a cached review, else a TokenReview); None
        when the API server refused it (remembered briefly)."""
        assert self.kube is not None
        key = hashlib.sha256("\n".join([token, *audiences]).encode()).hexdigest()
        user = self._reviews.get(key)
        if user is not None:
            return user  # type: ignore[no-any-return]
        if self._was_refused(key):
            return None
        if not may_block:
            raise _WouldBlock
        user = self.kube.token_review(token, audiences)
        if user is None:
            self._refuse(key)
            return None
        self._reviews.put(key, user)
        return user

    def _was_refused(self, key: str) -> bool:
        if self._refused is None:
            return False
        with self._refused_lock:
            return key in self._refused

    def _refuse(self, key: str) -> None:
        if self._refused is not None:
            with self._refused_lock:
                self._refused[key] = True


class _WouldBlock(Exception):
    """Knowing the caller needs a TokenReview: not on the event loop."""


def refuse_privileged_assertion(user: UserInfo, agent_user: str) -> None:
    """An asserted identity may not be one whose rights reach past RBAC (system:masters
    skips authorization altogether; the node authorizer trusts system:nodes), nor the
    agents' own account: any node's root holds the token that asserts."""
    groups = PRIVILEGED_GROUPS.intersection(user.groups)
    name = user.username
    if groups or name.startswith(NODE_USER_PREFIX) or name in PRIVILEGED_USERS | {agent_user}:
        what = f"group {sorted(groups)[0]}" if groups else f'user "{name}"'
        raise Forbidden(
            f"another agent asserted {what}: a privileged identity is never taken from an "
            "assertion (every node holds the token that asserts); call the pod's own node's "
            "agent, or act as a user whose RBAC allows it"
        )


def refuse_asserted(identity: Identity, what: str, allowed: bool) -> None:
    """`force` and network-interface moves from an asserted user need the opt-in."""
    if identity.asserted and not allowed:
        raise Forbidden(
            f'user "{identity.name}" reached this node through another agent, which asserts '
            f"identities with the token every node holds: {what} for an asserted user needs "
            "--allow-asserted-force on the agents (forwarding.allowAssertedForce)"
        )


def assertion_headers(user: UserInfo) -> list[tuple[str, str]]:
    """The headers a forwarding agent asserts `user` with: everything a SAR takes, less
    the privileged groups that receiving agents refuse (RBAC decides on the rest).

    Header names lose their case and cannot hold `/`, so extra keys are percent-encoded
    with uppercase letters escaped too (`%41`); values are percent-encoded.
    """
    headers = [(ASSERT_USER, user.username)]
    headers += [(ASSERT_GROUP, group) for group in user.groups if group not in PRIVILEGED_GROUPS]
    if user.uid:
        headers.append((ASSERT_UID, user.uid))
    for key, values in sorted(user.extra.items()):
        name = ASSERT_EXTRA + _escape_key(key)
        headers += [(name, quote(value, safe="")) for value in values]
    return headers


def asserted_user(username: str, headers: Mapping[str, list[str]]) -> UserInfo:
    """The inverse of `assertion_headers`, on the receiving agent."""
    extra = {
        unquote(name[len(ASSERT_EXTRA) :]): [unquote(v) for v in values]
        for name, values in headers.items()
        if name.startswith(ASSERT_EXTRA)
    }
    uid = (headers.get(ASSERT_UID) or [""])[0]
    return UserInfo(username, list(headers.get(ASSERT_GROUP, [])), uid, extra)


def _escape_key(key: str) -> str:
    safe = "abcdefghijklmnopqrstuvwxyz0123456789-._~"
    return "".join(c if c in safe else "".join(f"%{b:02X}" for b in c.encode()) for c in key)


class Authorizer:
    def __init__(
        self,
        kube: KubeClient | None,
        ttl: float,
        own_pod_only: bool = False,
        *,
        refuse_unbound: bool = False,
        asserted_force: bool = False,
    ) -> None:
        self.kube = kube
        self.asserted_force = asserted_force  # --allow-asserted-force
        self._decisions = _TtlCache(ttl)
        self.own_pod_only = own_pod_only
        self.refuse_unbound = refuse_unbound

    def require(
        self,
        identity: Identity,
        verb: str,
        namespace: str = "",
        name: str = "",
        *,
        resource: str = RESOURCE,
    ) -> None:
        target = f"{namespace}/{name}" if namespace else name or "*"
        if identity.trusted:
            log.info(
                "allow user=%s via=%s verb=%s pod=%s", identity.name, identity.via, verb, target
            )
            return
        if self.kube is None:
            raise Forbidden("no authorizer is configured")
        if self.refuse_unbound:
            _refuse_unbound_service_account(identity.user, resource, name)
        if self.own_pod_only and resource == RESOURCE:
            _refuse_other_pods(identity.user, verb, namespace, name)
        user = identity.user
        allowed, reason = self._decide(
            user,
            (verb, resource, namespace, name),
            lambda kube: kube.subject_access_review(
                user, verb, namespace, name, resource=resource, group=API_GROUP
            ),
        )
        log.info(
            "%s user=%s via=%s verb=%s%s pod=%s%s",
            "allow" if allowed else "deny",
            identity.name,
            identity.via,
            verb,
            "" if resource == RESOURCE else f" resource={resource}",
            target,
            f" reason={reason}" if reason else "",
        )
        if not allowed:
            raise Forbidden(
                _refusal(user.username, verb, resource, namespace, name),
                {"group": API_GROUP, "kind": resource, "name": name},
            )

    def require_path(self, identity: Identity, verb: str, path: str) -> None:
        """A non-resource URL (`get /metrics`), asked as the kubelet's metrics filter asks."""
        if identity.trusted:
            log.info(
                "allow user=%s via=%s verb=%s path=%s", identity.name, identity.via, verb, path
            )
            return
        if self.kube is None:
            raise Forbidden("no authorizer is configured")
        user = identity.user
        allowed, reason = self._decide(
            user, (verb, "path", path), lambda kube: kube.path_access_review(user, verb, path)
        )
        log.info(
            "%s user=%s via=%s verb=%s path=%s%s",
            "allow" if allowed else "deny",
            identity.name,
            identity.via,
            verb,
            path,
            f" reason={reason}" if reason else "",
        )
        if not allowed:
            raise Forbidden(f'user "{user.username}" cannot {verb} path "{path}"')

    def _decide(
        self,
        user: UserInfo,
        asked: tuple[str, ...],
        review: Callable[[KubeClient], tuple[bool, str]],
    ) -> tuple[bool, str]:
        """The cached decision for `user` and what was `asked`, else the review's."""
        assert self.kube is not None
        extra = tuple(sorted((k, tuple(v)) for k, v in user.extra.items()))
        key = (user.username, tuple(user.groups), user.uid, extra, *asked)
        decision: tuple[bool, str] | None = self._decisions.get(key)
        if decision is None:
            decision = review(self.kube)
            self._decisions.put(key, decision)
        return decision

    def require_mount(
        self,
        identity: Identity,
        namespace: str,
        pod: str,
        share_with: str | None,
        force: bool,
        *,
        netdev: bool = False,
    ) -> None:
        """A mount: `create` on the pod, on the pod it shares with too, and `force` if forced.
        A network interface moved into the pod leaves the host's network namespace: an
        asserted user needs the opt-in for it, as for `force`."""
        if netdev:
            refuse_asserted(identity, "moving a network interface", self.asserted_force)
        self.require(identity, "create", namespace, pod)
        if share_with:  # sharing across pods: the caller may mount into both
            self.require(identity, "create", namespace, share_with)
        self.require_force(identity, force, (namespace, pod))

    def require_force(self, identity: Identity, force: bool, *pods: tuple[str, str]) -> None:
        """A forced operation also needs `force` on every pod it touches (both, for a move)."""
        if force:
            refuse_asserted(identity, "force", self.asserted_force)
            for namespace, name in pods:
                self.require(identity, "force", namespace, name)

    def require_taking_held(
        self, identity: Identity, namespace: str, pod: str, holders: int, pod_uid: str
    ) -> None:
        """A suspend of GPUs that `holders` processes of the pod hold: it freezes them and
        takes their GPUs, which only a forced unmount may do, so it needs `force` on the
        pod as that does (an asserted user: the opt-in too). Asked once the suspend has
        found them, before anything changes; a GPU no process holds needs `delete` alone.

        Except for the pod itself: a token bound to this very pod (`pod_uid`), as the
        API server or a TokenReview vouches for it, suspends its own processes, as the
        idle policy `suspend` does on the pod's own annotation (`%gpu suspend`). Whoever
        holds that token runs in the pod, or could already exec into it."""
        if _own_pod(identity, namespace, pod, pod_uid):
            log.info(
                "allow user=%s via=%s verb=force pod=%s/%s reason=its own pod's bound token",
                identity.name,
                identity.via,
                namespace,
                pod,
            )
            return
        try:
            self.require_force(identity, True, (namespace, pod))
        except Forbidden as exc:
            who = "1 process holds" if holders == 1 else f"{holders} processes hold"
            raise Forbidden(
                f"{exc.message}; {who} the GPUs of pod {namespace}/{pod}, and a suspend takes "
                "them away as a forced unmount does; nothing was changed",
                exc.details,
            ) from exc


def _own_pod(identity: Identity, namespace: str, pod: str, pod_uid: str) -> bool:
    """The caller is the pod: a ServiceAccount of its namespace whose token is bound to
    it, by name and UID (a token of an earlier pod of that name is not), in extras that
    the API server (a front-proxy caller, or a TokenReview) gave, never another agent's
    assertion."""
    if identity.via not in ("token", "front-proxy"):
        return False
    user = identity.user
    parts = user.username.split(":")
    return (
        len(parts) == 4
        and user.username.startswith(SERVICE_ACCOUNT_PREFIX)
        and parts[2] == namespace
        and user.extra.get(POD_NAME_EXTRA) == [pod]
        and bool(pod_uid)
        and user.extra.get(POD_UID_EXTRA) == [pod_uid]
    )


def _refuse_unbound_service_account(user: UserInfo, resource: str, name: str) -> None:
    """--refuse-unbound-service-account-tokens: a ServiceAccount's token must be bound to a
    pod (its TokenReview names the pod in `extra`). A legacy Secret token, or one from a
    TokenRequest with no pod, outlives any pod and is bound by no pod rule, so it is
    refused. People, groups and other authenticators' users are not ServiceAccounts and
    pass on to RBAC."""
    if not user.username.startswith(SERVICE_ACCOUNT_PREFIX) or user.extra.get(POD_NAME_EXTRA):
        return
    raise Forbidden(
        f'user "{user.username}" holds a ServiceAccount token bound to no pod; this agent '
        "accepts only pod-bound ServiceAccount tokens (--refuse-unbound-service-account-tokens)",
        {"group": API_GROUP, "kind": resource, "name": name},
    )


def _refuse_other_pods(user: UserInfo, verb: str, namespace: str, name: str) -> None:
    """--pod-tokens-own-pod-only: a token bound to a pod (its TokenReview names the pod in
    `extra`) acts on that pod alone, whatever its ServiceAccount's RBAC: notebooks that
    share one ServiceAccount cannot touch each other's GPUs. Without a name, only `list`."""
    pods = user.extra.get(POD_NAME_EXTRA)
    if not pods:
        return
    parts = user.username.split(":")
    own = (parts[2], pods[0]) if len(parts) == 4 and len(pods) == 1 else None
    if (namespace, name) == own or (not name and verb == "list"):
        return
    where = f"pod {own[0]}/{own[1]}" if own else "a pod"
    target = f"pod {namespace}/{name}" if name else f"{RESOURCE} at large"
    raise Forbidden(
        f'user "{user.username}" holds a token bound to {where}: it acts on that pod only, '
        f"not on {target} (--pod-tokens-own-pod-only)",
        {"group": API_GROUP, "kind": RESOURCE, "name": name},
    )


def _refusal(user: str, verb: str, resource: str, namespace: str, name: str) -> str:
    """The refusal in the API server's own words, plus what `force` is when that is the verb."""
    scope = f'in the namespace "{namespace}"' if namespace else "at the cluster scope"
    message = f'user "{user}" cannot {verb} {resource}.{API_GROUP} {scope}'
    if name:
        message += f" (pod {namespace}/{name})" if namespace else f' ("{name}")'
    if verb == "force":
        message += ": forcing overrides another holder, so it is a permission of its own"
    return message
