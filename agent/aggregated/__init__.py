"""The aggregated API `hotmount.io/v1alpha1`, served behind an APIService.

kubectl and nvcli reach it through the API server with the kubeconfig's own
credentials; the API server authenticates, then forwards the user in
`X-Remote-*` headers (verified in agent/auth/). Authorization is ours: the same
SubjectAccessReviews as the /v1 API. Discovery documents are open to every
authenticated caller, as Kubernetes' own are.

    GPUMount (namespaced; name = the pod)  create, get, list (also across namespaces), delete;
                                            subresources suspend, resume (POST; GET: progress)
    NodeDevices (cluster; name = the node) get, list
    Reassignment (namespaced)               create

Lists and gets answer kubectl's Table requests (hotmount/wire/tables.py), so `kubectl get` prints
useful columns; other clients get the objects.

The API server authorizes the aggregated path itself before it proxies, by the path's
scope. So a move between two pods of one namespace is a namespaced Reassignment, which a
RoleBinding to `hotmount-user` allows; a move across namespaces is the cluster-scoped
`POST .../reassignments`, which needs `create reassignments` at the cluster scope (a
ClusterRoleBinding). Either way the agent then checks `delete` on the source pod and
`create` on the target (and `force` on both when forced). Listing nodes' devices is
cluster-scoped (`nodedevices`): it shows holders in every namespace.

One module per resource (gpumounts, nodedevices, reassignments) and one for discovery;
objects.py writes the wire shapes they share, answers.py a list (with the other nodes'
part) or a get, as JSON or as kubectl's Table. The operations on one pod (a GPUMount's
create, get, patch, delete, suspend and resume; a Reassignment) are rows of the
operation table, which makes their routes here and in /v1 (agent/operations/).
"""

from __future__ import annotations

from fastapi import APIRouter

from agent.aggregated import discovery, gpumounts, nodedevices

# In the order the routes were always registered; no two of their paths overlap.
router = APIRouter()
for part in (discovery, gpumounts, nodedevices):
    router.include_router(part.router)
