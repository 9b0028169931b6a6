"""How a list or a get is answered: this node's objects with every other node's (a
fan-out), as a Kubernetes list or as the Table kubectl asks for (hotmount/wire/tables.py)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Annotated, Any

from fastapi import Query, Request
from fastapi.responses import JSONResponse, Response

from agent.aggregated.objects import kube_list
from agent.auth.identity import Identity
from agent.cluster.fanout import MissingNode, missing_warnings
from agent.cluster.gateway import LOCAL_ONLY, Gateway
from hotmount.wire.tables import IncludeObject, table, table_version

# `?includeObject=`: what a Table row carries (kubectl asks for Metadata, the default).
Include = Annotated[IncludeObject, Query(alias="includeObject")]


def list_answer(
    request: Request,
    caller: Identity,
    gateway: Gateway | None,
    kind: str,
    local: list[dict[str, Any]],
    include: IncludeObject,
) -> Any:
    """This node's objects and every other node's, as a list, or its Table when kubectl
    asked for one. The nodes that did not answer are named in the list's metadata
    (`missingNodes`) and in Warning headers, which kubectl prints."""
    others = _other_nodes(request, caller, gateway)
    objects = local + others.items
    version = table_version(request.headers.get("accept"))
    answer = kube_list(kind, objects) if version is None else table(kind, objects, version, include)
    if others.missing:
        answer["metadata"]["missingNodes"] = [m.as_json() for m in others.missing]
    # Plain JSON already: FastAPI's own encoder would walk every value of 500 nodes' lists
    # again (a quarter of a second at 500 nodes of 8 GPUs).
    response = JSONResponse(answer)
    for warning in missing_warnings(others.missing):
        response.headers.append("Warning", warning)
    return response


def one_answer(request: Request, kind: str, answer: Any, include: IncludeObject) -> Any:
    """One object (made here, or another node's agent's answer passed through), or its
    Table. Errors pass through as they came."""
    version = table_version(request.headers.get("accept"))
    if version is None:
        return answer
    if isinstance(answer, Response):
        if answer.status_code != 200:
            return answer
        answer = json.loads(bytes(answer.body))
    return table(kind, [answer], version, include)


@dataclass
class _Others:
    items: list[Any] = field(default_factory=list)
    missing: list[MissingNode] = field(default_factory=list)


def _other_nodes(request: Request, caller: Identity, gateway: Gateway | None) -> _Others:
    """The same list from every other agent, unless this request is one of those asks."""
    if gateway is None or request.headers.get(LOCAL_ONLY):
        return _Others()
    fanned = gateway.fan_out(caller, request.url.path)  # validated (agent/cluster/peer_answers.py)
    return _Others(items=fanned.items, missing=list(fanned.missing))
