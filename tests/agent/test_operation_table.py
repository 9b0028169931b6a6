"""Both API faces come from the operation table (agent/operations/): every row's /v1
and aggregated routes exist with its method, and each is placed (authorized, its pod
looked up, forwarded when elsewhere) by the table's dependency before its handler runs.
No runc, no agent process: the routers as the app includes them."""

from __future__ import annotations

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
        placing = [d for d in route.dependant.dependencies if d.call.__name__ == "placed"]
        assert len(placing) == 1, (method, path)
        # the caller is authenticated first, inside the placement
        names = {d.call.__name__ for d in placing[0].dependencies}
        assert "request_identity" in names, (method, path, names)


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
