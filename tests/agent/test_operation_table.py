"""Both API faces come from the operation table (agent/operations/): every row's /v1
and aggregated routes exist with its method, and each is placed (authorized, its pod
looked up, forwarded when elsewhere) in its handler's thread before the use case runs.
No runc, no agent process: the routers as the app includes them."""

from __future__ import annotations

import inspect

from fastapi.dependencies.models import Dependant
from fastapi.routing import APIRoute

from agent import aggregated, operations
from agent.aggregated.objects import PREFIX


def table_routes() -> dict[tuple[str, str], APIRoute]:
    v1, kinds = operations.routers()
    return {
        (method, route.path): route
        for route in [*v1.routes, *kinds.routes]
        if isinstance(route, APIRoute)
        for method in route.methods
    }


def test_every_row_makes_its_routes_on_both_faces() -> None:
    routes = table_routes()
    expected = set()
    for op in operations.OPERATIONS:
        faces = ([op.v1] if op.v1 else []) + [f for f in op.aggregated]
        assert faces, op.name
        for face in faces:
            prefix = "/v1" if face is op.v1 else PREFIX
            expected.add((op.method, prefix + face.path))
    assert set(routes) == expected
    # the pod operations of both faces, by the paths clients and docs/api.md use
    assert ("POST", "/v1/namespaces/{namespace}/pods/{pod}/devices") in routes
    assert ("DELETE", "/v1/namespaces/{namespace}/pods/{pod}/devices/{device:path}") in routes
    assert ("POST", f"{PREFIX}/v1alpha1/namespaces/{{namespace}}/gpumounts") in routes
    assert ("DELETE", f"{PREFIX}/v1alpha1/namespaces/{{namespace}}/gpumounts/{{pod}}") in routes
    assert ("POST", f"{PREFIX}/v1alpha1/reassignments") in routes


def test_each_table_route_is_placed_before_its_handler() -> None:
    for (method, path), route in table_routes().items():
        asking = [d for d in route.dependant.dependencies if d.call.__name__ == "asked"]
        assert len(asking) == 1, (method, path)
        # the caller is authenticated first, in the table's dependency
        names = {d.call.__name__ for d in asking[0].dependencies}
        assert "request_identity" in names, (method, path, names)
        # the placement runs in the handler, before the use case
        assert route.dependant.call.__name__ == "endpoint", (method, path)


def dependencies(dependant: Dependant) -> list[Dependant]:
    return [found for d in dependant.dependencies for found in [d, *dependencies(d)] if d.call]


def test_each_table_route_takes_one_worker_thread() -> None:
    """FastAPI runs a plain `def` dependency in a worker thread of its own: every
    dependency of a pod route is a coroutine, so the handler's thread is the call's only
    one (the placement, authorization included, runs in it). A sync placement beside the
    handler cost every pod call a second hop (issue 41's unmanaged mount)."""
    for (method, path), route in table_routes().items():
        assert not inspect.iscoroutinefunction(route.dependant.call), (method, path)
        for dependency in dependencies(route.dependant):
            assert inspect.iscoroutinefunction(dependency.call), (method, path, dependency.call)


def test_no_pod_operation_is_written_outside_the_table() -> None:
    """The aggregated router's own routes are lists, discovery and nodedevices only."""
    table = set(table_routes())
    own = {
        (method, route.path)
        for route in aggregated.router.routes
        if isinstance(route, APIRoute)
        for method in route.methods
    }
    assert not own & table
    assert all("/gpumounts/{pod}" not in path for _, path in own), own
    assert all("reassignments" not in path for _, path in own), own
