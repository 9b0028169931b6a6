"""Authorization: a SubjectAccessReview per decision (cached briefly) for the user on
`gpumounts` (or `nodedevices`) in the pod's namespace; `force` as a permission of its own;
a pod's own bound token acting on itself; every decision logged."""

from __future__ import annotations

import logging
from collections.abc import Callable

from agent.auth.assertion import refuse_asserted
from agent.auth.cache import TtlCache
from agent.auth.identity import (
    API_GROUP,
    POD_NAME_EXTRA,
    POD_UID_EXTRA,
    RESOURCE,
    SERVICE_ACCOUNT_PREFIX,
    Identity,
)
from agent.errors import Forbidden
from agent.kube.client import KubeClient, UserInfo

log = logging.getLogger("hotmount.audit")


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
        self._decisions = TtlCache(ttl)
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
