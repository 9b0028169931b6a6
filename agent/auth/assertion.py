"""Identities one agent asserts to another when it forwards a call: the headers that
carry them, read back on the receiving agent, and the identities never believed from an
assertion (every node holds the token that asserts)."""

from __future__ import annotations

from collections.abc import Mapping
from urllib.parse import quote, unquote

from agent.auth.identity import (
    ASSERT_EXTRA,
    ASSERT_GROUP,
    ASSERT_UID,
    ASSERT_USER,
    NODE_USER_PREFIX,
    PRIVILEGED_GROUPS,
    PRIVILEGED_USERS,
    Identity,
)
from agent.errors import Forbidden
from agent.kube.client import UserInfo


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
