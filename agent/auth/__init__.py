"""Who is calling, and may they: one authorization model for every entry path.

Authentication, first match wins (agent/http/guard.py runs it before any body is read):
1. the root-only unix socket: the node's own root. The socket is 0600 from birth
   (agent/http/server.py), and the peer's uid (SO_PEERCRED) must be root's or the agent's;
2. `X-Remote-User`/`-Group`/`-Extra-*` from the aggregated API's front proxy, trusted
   only with a TLS client certificate verified against the request-header CA and
   carrying one of its allowed names; anything else presenting them gets 401;
3. `Authorization: Bearer`: the standalone token file, or a TokenReview (a refused
   token is remembered briefly, so a flood of bad tokens is not a flood of reviews);
   an agent forwarding a bearer caller's request forwards the caller's own token only
   when it is bound to the agents' audience (--token-audiences; agent/cluster/gateway.py), so
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
