"""Authentication, first match wins (the order in agent/auth/__init__.py): the unix
socket's root, the front proxy's verified client certificate, a bearer token (the
standalone file, or a TokenReview, with refused tokens remembered briefly so that a flood
of bad tokens is not a flood of reviews), else anonymous only if configured."""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import threading
from urllib.parse import unquote

from cachetools import TTLCache

from agent.auth.assertion import asserted_user, refuse_privileged_assertion
from agent.auth.cache import TtlCache
from agent.auth.identity import (
    ASSERT_USER,
    REMOTE_EXTRA,
    REMOTE_GROUP,
    REMOTE_USER,
    CallerContext,
    FrontProxyTrust,
    Identity,
)
from agent.config import AgentSettings
from agent.errors import Unauthorized
from agent.kube.client import KubeClient, UserInfo

log = logging.getLogger("hotmount.audit")


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
        self._reviews = TtlCache(settings.authz_cache_ttl)
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
