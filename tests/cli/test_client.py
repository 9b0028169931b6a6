"""The importable client against httpx.MockTransport: paths, bodies, results, the error tree."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from agent.schemas import PodRef
from cli.client import (
    AgentTransport,
    AggregatedTransport,
    Busy,
    Conflict,
    Forbidden,
    HotmountClient,
    HotmountClientError,
    InvalidRequest,
    NotFound,
    Timeout,
    Unauthorized,
    Unavailable,
    http_client,
)
from tests.cli.stub_agent import CONTAINER_ID, GPUS, _mounted, status

UUID0, UUID1 = GPUS[0]["uuid"], GPUS[1]["uuid"]
Handler = Callable[[httpx.Request], httpx.Response]


def mount_result(**over: Any) -> dict[str, Any]:
    return {
        "namespace": "ml",
        "pod": "nb-0",
        "container": "main",
        "containerId": CONTAINER_ID,
        "mounted": [_mounted(GPUS[0])],
        "alreadyMounted": [],
        "holderPod": None,
        **over,
    }


def unmount_result(key: str, pids: list[int] | None = None) -> dict[str, Any]:
    return {
        "namespace": "ml",
        "pod": "nb-0",
        "container": "main",
        "containerId": CONTAINER_ID,
        "unmounted": [key],
        "notMounted": [],
        "stoppedPids": pids or [],
    }


def pod_devices() -> dict[str, Any]:
    return {
        "namespace": "ml",
        "pod": "nb-0",
        "containers": [
            {"container": "main", "containerId": CONTAINER_ID, "devices": [_mounted(GPUS[1])]}
        ],
    }


def device_list(node: str = "node-a") -> dict[str, Any]:
    return {
        "node": node,
        "devices": [
            {"key": UUID0, "kind": "gpu", "index": 0, "uuid": UUID0, "nodes": ["/dev/nvidia0"]}
        ],
    }


def reassign_result(force: bool = False) -> dict[str, Any]:
    return {
        "device": UUID0,
        "from": {"namespace": "a", "pod": "p"},
        "to": {"namespace": "b", "pod": "q"},
        "unmounted": unmount_result(UUID0, [4242] if force else []),
        "mounted": mount_result(namespace="b", pod="q"),
    }


def client(handler: Handler, aggregated: bool = False) -> tuple[HotmountClient, list]:
    seen: list[httpx.Request] = []

    def record(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return handler(request)

    http = http_client("https://agent.test", transport=httpx.MockTransport(record))
    kind = AggregatedTransport if aggregated else AgentTransport
    return HotmountClient(kind(http, "the test agent")), seen


# -- /v1 -------------------------------------------------------------------------------------


def test_agent_mount_posts_a_mount_request() -> None:
    hm, seen = client(lambda r: httpx.Response(200, json=mount_result()))
    result = hm.mount("ml", "nb-0", devices=["0", "nvidia.com/gpu=1"], container="main")
    assert result.mounted[0].key == UUID0 and result.container_id == CONTAINER_ID
    (req,) = seen
    assert (req.method, req.url.path) == ("POST", "/v1/namespaces/ml/pods/nb-0/devices")
    assert json.loads(req.content) == {
        "container": "main",
        "devices": ["0", "nvidia.com/gpu=1"],
        "force": False,
    }


def test_agent_mount_by_count() -> None:
    hm, seen = client(lambda r: httpx.Response(200, json=mount_result(holderPod="nb-0-h")))
    assert hm.mount("ml", "nb-0", count=2).holder_pod == "nb-0-h"
    assert json.loads(seen[0].content) == {"count": 2, "force": False}


def test_agent_unmount_one_delete_per_device_merged() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        key = UUID0 if request.url.path.endswith("/0") else UUID1
        return httpx.Response(200, json=unmount_result(key, [7]))

    hm, seen = client(handler)
    result = hm.unmount("ml", "nb-0", devices=["0", "nvidia.com/gpu=1"], force=True)
    assert result.unmounted == [UUID0, UUID1] and result.stopped_pids == [7]
    assert [r.url.raw_path.decode() for r in seen] == [
        "/v1/namespaces/ml/pods/nb-0/devices/0?force=true",
        "/v1/namespaces/ml/pods/nb-0/devices/nvidia.com%2Fgpu%3D1?force=true",
    ]


def test_agent_unmount_all_asks_status_first() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        if request.method == "GET":
            return httpx.Response(200, json=pod_devices())
        return httpx.Response(200, json=unmount_result(UUID1))

    hm, seen = client(handler)
    assert hm.unmount("ml", "nb-0", container="main").unmounted == [UUID1]
    assert [(r.method, r.url.path) for r in seen] == [
        ("GET", "/v1/namespaces/ml/pods/nb-0/devices"),
        ("DELETE", f"/v1/namespaces/ml/pods/nb-0/devices/{UUID1}"),
    ]
    assert seen[1].url.params["container"] == "main"


def test_agent_status_list_move() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/devices":
            return httpx.Response(200, json=device_list())
        if request.url.path == "/v1/reassign":
            return httpx.Response(200, json=reassign_result(force=True))
        return httpx.Response(200, json=pod_devices())

    hm, seen = client(handler)
    assert hm.status("ml", "nb-0").containers[0].devices[0].key == UUID1
    assert [d.node for d in hm.list_devices()] == ["node-a"]
    with pytest.raises(NotFound):
        hm.list_devices("node-b")  # a direct agent serves its own node only
    moved = hm.move("0", ("a", "p"), PodRef(namespace="b", pod="q", container="main"), force=True)
    assert moved.unmounted.stopped_pids == [4242]
    assert json.loads(seen[-1].content) == {
        "device": "0",
        "from": {"namespace": "a", "pod": "p"},
        "to": {"namespace": "b", "pod": "q", "container": "main"},
        "force": True,
    }


def test_agent_sends_the_bearer_token() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json=device_list())

    hm = HotmountClient.for_agent(
        "http://agent.test", "s3cret", transport=httpx.MockTransport(handler)
    )
    with hm:
        hm.list_devices()
    assert seen[0].headers["Authorization"] == "Bearer s3cret"
    assert seen[0].headers["User-Agent"].startswith("nvcli/")


def test_standalone_container_paths() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        if request.method == "POST":
            return httpx.Response(200, json=mount_result(namespace=None, pod=None))
        if request.method == "DELETE":
            return httpx.Response(200, json=unmount_result(UUID0))
        return httpx.Response(200, json=pod_devices())

    hm, seen = client(handler)
    hm.mount_container(CONTAINER_ID, ["0"])
    hm.unmount_container(CONTAINER_ID, ["0"])
    hm.container_status(CONTAINER_ID)
    assert [r.url.path for r in seen] == [
        f"/v1/containers/{CONTAINER_ID}/devices",
        f"/v1/containers/{CONTAINER_ID}/devices/0",
        f"/v1/containers/{CONTAINER_ID}/devices",
    ]
    aggregated, _ = client(handler, aggregated=True)
    with pytest.raises(InvalidRequest):
        aggregated.mount_container(CONTAINER_ID, ["0"])


# -- hotmount.io/v1alpha1 ------------------------------------------------------------------------


def test_aggregated_paths_and_objects() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if path.endswith("/gpumounts") and request.method == "POST":
            return httpx.Response(201, json={"kind": "GPUMount", "status": mount_result()})
        if request.method == "DELETE":
            return httpx.Response(200, json={"kind": "GPUMount", "status": unmount_result(UUID0)})
        if path.endswith("/gpumounts/nb-0"):
            return httpx.Response(200, json={"kind": "GPUMount", "status": pod_devices()})
        if path.endswith("/nodedevices"):
            items = [{"metadata": {"name": n}, "status": device_list(n)} for n in ("a", "b")]
            return httpx.Response(200, json={"kind": "NodeDevicesList", "items": items})
        if "/nodedevices/" in path:
            return httpx.Response(200, json={"metadata": {"name": "a"}, "status": device_list("a")})
        return httpx.Response(201, json={"kind": "Reassignment", "status": reassign_result()})

    hm, seen = client(handler, aggregated=True)
    hm.mount("ml", "nb-0", devices=["0"])
    hm.unmount("ml", "nb-0", devices=["0", "1"], container="main", force=True)
    hm.unmount("ml", "nb-0")
    hm.status("ml", "nb-0")
    assert [d.node for d in hm.list_devices()] == ["a", "b"]
    assert [d.node for d in hm.list_devices("a")] == ["a"]
    hm.move("0", ("a", "p"), ("b", "q"))

    prefix = "/apis/hotmount.io/v1alpha1"
    query = "device=0&device=1&force=true&container=main"
    assert [(r.method, r.url.raw_path.decode()) for r in seen] == [
        ("POST", f"{prefix}/namespaces/ml/gpumounts"),
        ("DELETE", f"{prefix}/namespaces/ml/gpumounts/nb-0?{query}"),
        ("DELETE", f"{prefix}/namespaces/ml/gpumounts/nb-0"),
        ("GET", f"{prefix}/namespaces/ml/gpumounts/nb-0"),
        ("GET", f"{prefix}/nodedevices"),
        ("GET", f"{prefix}/nodedevices/a"),
        ("POST", f"{prefix}/reassignments"),
    ]  # fmt: skip
    assert json.loads(seen[0].content) == {
        "apiVersion": "hotmount.io/v1alpha1",
        "kind": "GPUMount",
        "metadata": {"name": "nb-0", "namespace": "ml"},
        "spec": {"devices": ["0"], "force": False},
    }
    move = json.loads(seen[-1].content)
    assert move["kind"] == "Reassignment" and move["spec"]["from"] == {"namespace": "a", "pod": "p"}


# -- errors ----------------------------------------------------------------------------------------

ERRORS = [
    (400, "BadRequest", InvalidRequest, 2),
    (400, "InvalidDevice", InvalidRequest, 2),
    (400, "InvalidContainer", InvalidRequest, 2),
    (400, "NotInContainer", InvalidRequest, 2),
    (401, "Unauthorized", Unauthorized, 5),
    (403, "Forbidden", Forbidden, 5),
    (404, "NotFound", NotFound, 4),
    (404, "PodNotFound", NotFound, 4),
    (404, "ContainerNotFound", NotFound, 4),
    (404, "DeviceNotFound", NotFound, 4),
    (409, "DeviceBusy", Busy, 3),
    (409, "DeviceClaimed", Conflict, 3),
    (409, "AllocatedToPod", Conflict, 3),
    (409, "PodNotRunning", Conflict, 3),
    (409, "Unschedulable", Conflict, 3),
    (409, "UnsafePath", Conflict, 3),
    (422, "Invalid", InvalidRequest, 2),
    (503, "NotReady", Unavailable, 1),
    (504, "Timeout", Timeout, 6),
    (500, "InternalError", HotmountClientError, 1),
]


@pytest.mark.parametrize(("code", "reason", "exc", "exit_code"), ERRORS, ids=[e[1] for e in ERRORS])
def test_every_status_reason_maps_to_an_exception_and_exit_code(
    code: int, reason: str, exc: type[HotmountClientError], exit_code: int
) -> None:
    details = {"holders": [{"pid": 4242, "command": "python", "path": "/dev/nvidia0"}]}
    body = status(code, reason, f"it failed: {reason}", details)
    hm, _ = client(lambda r: httpx.Response(code, json=body))
    with pytest.raises(HotmountClientError) as err:
        hm.mount("ml", "nb-0", devices=["0"])
    assert type(err.value) is exc
    assert err.value.exit_code == exit_code
    assert (err.value.reason, err.value.code) == (reason, code)
    assert err.value.message == f"it failed: {reason}"
    if exc is Busy:
        assert err.value.holders[0]["pid"] == 4242


def test_the_api_servers_own_status_and_non_json_errors() -> None:
    apiserver_status = {**status(403, "Forbidden", "gpumounts is forbidden"), "metadata": {}}
    hm, _ = client(lambda r: httpx.Response(403, json=apiserver_status), aggregated=True)
    with pytest.raises(Forbidden, match="forbidden"):
        hm.status("ml", "nb-0")
    hm, _ = client(lambda r: httpx.Response(502, text="<html>bad gateway</html>"))
    with pytest.raises(Unavailable) as err:
        hm.status("ml", "nb-0")
    assert err.value.reason == "BadGateway" and "bad gateway" in err.value.message


def test_http_timeouts_and_connection_failures() -> None:
    def slow(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("timed out", request=request)

    def refused(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    hm, _ = client(slow)
    with pytest.raises(Timeout) as err:
        hm.mount("ml", "nb-0", count=1)
    assert err.value.exit_code == 6
    hm, _ = client(refused)
    with pytest.raises(Unavailable) as unavailable:
        hm.list_devices()
    assert unavailable.value.exit_code == 1


def test_bad_requests_are_refused_before_sending() -> None:
    hm, seen = client(lambda r: httpx.Response(200, json=mount_result()))
    with pytest.raises(InvalidRequest, match="either devices or count"):
        hm.mount("ml", "nb-0", devices=["0"], count=1)
    with pytest.raises(InvalidRequest):
        hm.mount("ml", "nb-0", devices=["/dev/sda"])
    with pytest.raises(InvalidRequest):
        hm.move("0", ("Bad_NS", "p"), ("b", "q"))
    assert seen == []


def test_an_answer_that_does_not_match_the_schema() -> None:
    hm, _ = client(lambda r: httpx.Response(200, json={"unexpected": True}))
    with pytest.raises(HotmountClientError, match="unexpected answer"):
        hm.status("ml", "nb-0")
