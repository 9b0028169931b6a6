"""Discovery: the APIGroup and its APIResourceList, which kubectl reads to learn the
resources' names, scopes, verbs and short names. Open to every authenticated caller, as
Kubernetes' own discovery documents are."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from agent.aggregated.objects import GROUP, GROUP_VERSION, PREFIX, VERSION
from agent.http.deps import Caller

router = APIRouter(prefix=PREFIX, tags=["aggregated"])


@router.get("")
def api_group(caller: Caller) -> dict[str, Any]:
    version = {"groupVersion": GROUP_VERSION, "version": VERSION}
    return {
        "kind": "APIGroup",
        "apiVersion": "v1",
        "name": GROUP,
        "versions": [version],
        "preferredVersion": version,
    }


@router.get(f"/{VERSION}")
def api_resources(caller: Caller) -> dict[str, Any]:
    return {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": GROUP_VERSION,
        "resources": [
            {
                "name": "gpumounts",
                "singularName": "gpumount",
                "namespaced": True,
                "kind": "GPUMount",
                "verbs": ["create", "delete", "get", "list", "patch"],
                "shortNames": ["gm"],
            },
            *(
                {
                    "name": f"gpumounts/{sub}",
                    "namespaced": True,
                    "kind": "GPUMount",
                    "verbs": ["create", "get"] if sub in ("suspend", "resume") else ["create"],
                }
                for sub in ("suspend", "resume", "acquire", "release")
            ),
            {
                "name": "nodedevices",
                "singularName": "nodedevices",
                "namespaced": False,
                "kind": "NodeDevices",
                "verbs": ["get", "list"],
            },
            # Namespaced: `kubectl create -n NS -f move.yaml` posts to
            # namespaces/NS/reassignments. The cluster-scoped POST .../reassignments (moves
            # across namespaces) is the same kind at the cluster scope; discovery has one
            # entry per resource name, so it is documented in docs/api.md, not listed twice.
            {
                "name": "reassignments",
                "singularName": "reassignment",
                "namespaced": True,
                "kind": "Reassignment",
                "verbs": ["create"],
            },
        ],
    }
