"""Who a caller is: the identity every entry path produces (agent/auth/authenticate.py),
the request facts authentication reads, and the names whose rights reach past RBAC.

The whole model (entry paths, assertion, authorization) is described in
agent/auth/__init__.py."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from agent.kube.client import UserInfo

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
    # where it is bound to their audience (agent/cluster/gateway.py), else asserted.
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
