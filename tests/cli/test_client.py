"""The importable client against a real recording HTTP server: paths, bodies, results, the
error tree."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from typing import Any

import pytest

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
from hotmount.wire.schemas import PodRef
from tests.cli.stub_agent import CONTAINER_ID, GPUS, _mounted, status
from tests.support.http_recorder import RecordingServer, Reply, Seen

UUID0, UUID1 = GPUS[0]["uuid"], GPUS[1]["uuid"]
Handler = Callable[[Seen], Reply]
Serve = Callable[..., tuple[HotmountClient, list[Seen]]]


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


@pytest.fixture
def serve() -> Iterator[Serve]:
    """`serve(handler, aggregated=False)`: a client of a real server answering from
    `handler`, and the requests that server received."""
    with ExitStack() as stack:

        def start(handler: Handler, aggregated: bool = False) -> tuple[HotmountClient, list[Seen]]:
            server = stack.enter_context(RecordingServer(handler))
            kind = AggregatedTransport if aggregated else AgentTransport
            http = http_client(server.url, timeout=30)
            hm = stack.enter_context(HotmountClient(kind(http, "the test agent")))
            return hm, server.seen

        yield start


# -- /v1 -------------------------------------------------------------------------------------


def test_agent_mount_posts_a_mount_request(serve: Serve) -> None:
    hm, seen = serve(lambda r: Reply(200, json=mount_result()))
    result = hm.mount("ml", "nb-0", devices=["0", "nvidia.com/gpu=1"], container="main")
    assert result.mounted[0].key == UUID0 and result.container_id == CONTAINER_ID
    (req,) = seen
    assert (req.method, req.path) == ("POST", "/v1/namespaces/ml/pods/nb-0/devices")
    assert req.json() == {
        "container": "main",
        "devices": ["0", "nvidia.com/gpu=1"],
        "force": False,
    }


def test_agent_mount_by_count(serve: Serve) -> None:
    hm, seen = serve(lambda r: Reply(200, json=mount_result(holderPod="nb-0-h")))
    assert hm.mount("ml", "nb-0", count=2).holder_pod == "nb-0-h"
    assert seen[0].json() == {"count": 2, "force": False}


def test_agent_unmount_one_delete_per_device_merged(serve: Serve) -> None:
    def handler(request: Seen) -> Reply:
        key = UUID0 if request.path.endswith("/0") else UUID1
        return Reply(200, json=unmount_result(key, [7]))

    hm, seen = serve(handler)
    result = hm.unmount("ml", "nb-0", devices=["0", "nvidia.com/gpu=1"], force=True)
    assert result.unmounted == [UUID0, UUID1] and result.stopped_pids == [7]
    assert [r.raw_path for r in seen] == [
        "/v1/namespaces/ml/pods/nb-0/devices/0?force=true",
        "/v1/namespaces/ml/pods/nb-0/devices/nvidia.com%2Fgpu%3D1?force=true",
    ]


def test_agent_unmount_all_asks_status_first(serve: Serve) -> None:
    def handler(request: Seen) -> Reply:
        if request.method == "GET":
            return Reply(200, json=pod_devices())
        return Reply(200, json=unmount_result(UUID1))

    hm, seen = serve(handler)
    assert hm.unmount("ml", "nb-0", container="main").unmounted == [UUID1]
    assert [(r.method, r.path) for r in seen] == [
        ("GET", "/v1/namespaces/ml/pods/nb-0/devices"),
        ("DELETE", f"/v1/namespaces/ml/pods/nb-0/devices/{UUID1}"),
    ]
    assert seen[1].params["container"] == "main"


def test_agent_status_list_move(serve: Serve) -> None:
    def handler(request: Seen) -> Reply:
        if request.path == "/v1/devices":
            return Reply(200, json=device_list())
        if request.path == "/v1/reassign":
            return Reply(200, json=reassign_result(force=True))
        return Reply(200, json=pod_devices())

    hm, seen = serve(handler)
    assert hm.status("ml", "nb-0").containers[0].devices[0].key == UUID1
    assert [d.node for d in hm.list_devices()] == ["node-a"]
    with pytest.raises(NotFound):
        hm.list_devices("node-b")  # a direct agent serves its own node only
    moved = hm.move("0", ("a", "p"), PodRef(namespace="b", pod="q", container="main"), force=True)
    assert moved.unmounted.stopped_pids == [4242]
    assert seen[-1].json() == {
        "device": "0",
        "from": {"namespace": "a", "pod": "p"},
        "to": {"namespace": "b", "pod": "q", "container": "main"},
        "force": True,
    }


def test_agent_sends_the_bearer_token() -> None:
    reply = Reply(200, json=device_list())
    with (
        RecordingServer(lambda r: reply) as server,
        HotmountClient.for_agent(server.url, "s3cret") as hm,
    ):
        hm.list_devices()
        hm.list_devices()
    assert [r.headers["authorization"] for r in server.seen] == ["Bearer s3cret"] * 2
    assert server.seen[0].headers["user-agent"].startswith("nvcli/")
    assert server.seen[0].client_port == server.seen[1].client_port  # one connection kept


def test_standalone_container_paths(serve: Serve) -> None:
    def handler(request: Seen) -> Reply:
        if request.method == "POST":
            return Reply(200, json=mount_result(namespace=None, pod=None))
        if request.method == "DELETE":
            return Reply(200, json=unmount_result(UUID0))
        return Reply(200, json=pod_devices())

    hm, seen = serve(handler)
    hm.mount_container(CONTAINER_ID, ["0"])
    hm.unmount_container(CONTAINER_ID, ["0"])
    hm.container_status(CONTAINER_ID)
    assert [r.path for r in seen] == [
        f"/v1/containers/{CONTAINER_ID}/devices",
        f"/v1/containers/{CONTAINER_ID}/devices/0",
        f"/v1/containers/{CONTAINER_ID}/devices",
    ]
    aggregated, _ = serve(handler, aggregated=True)
    with pytest.raises(InvalidRequest):
        aggregated.mount_container(CONTAINER_ID, ["0"])


# -- hotmount.io/v1alpha1 ------------------------------------------------------------------------


def test_aggregated_paths_and_objects(serve: Serve) -> None:
    def handler(request: Seen) -> Reply:
        path = request.path
        if path.endswith("/gpumounts") and request.method == "POST":
            return Reply(201, json={"kind": "GPUMount", "status": mount_result()})
        if request.method == "DELETE":
            return Reply(200, json={"kind": "GPUMount", "status": unmount_result(UUID0)})
        if path.endswith("/gpumounts/nb-0"):
            return Reply(200, json={"kind": "GPUMount", "status": pod_devices()})
        if path.endswith("/nodedevices"):
            items = [{"metadata": {"name": n}, "status": device_list(n)} for n in ("a", "b")]
            return Reply(200, json={"kind": "NodeDevicesList", "items": items})
        if "/nodedevices/" in path:
            return Reply(200, json={"metadata": {"name": "a"}, "status": device_list("a")})
        return Reply(201, json={"kind": "Reassignment", "status": reassign_result()})

    hm, seen = serve(handler, aggregated=True)
    hm.mount("ml", "nb-0", devices=["0"])
    hm.unmount("ml", "nb-0", devices=["0", "1"], container="main", force=True)
    hm.unmount("ml", "nb-0")
    hm.status("ml", "nb-0")
    assert [d.node for d in hm.list_devices()] == ["a", "b"]
    assert [d.node for d in hm.list_devices("a")] == ["a"]
    hm.move("0", ("a", "p"), ("b", "q"))

    prefix = "/apis/hotmount.io/v1alpha1"
    query = "device=0&device=1&force=true&container=main"
    assert [(r.method, r.raw_path) for r in seen] == [
        ("POST", f"{prefix}/namespaces/ml/gpumounts"),
        ("DELETE", f"{prefix}/namespaces/ml/gpumounts/nb-0?{query}"),
        ("DELETE", f"{prefix}/namespaces/ml/gpumounts/nb-0"),
        ("GET", f"{prefix}/namespaces/ml/gpumounts/nb-0"),
        ("GET", f"{prefix}/nodedevices"),
        ("GET", f"{prefix}/nodedevices/a"),
        ("POST", f"{prefix}/reassignments"),
    ]  # fmt: skip
    assert seen[0].json() == {
        "apiVersion": "hotmount.io/v1alpha1",
        "kind": "GPUMount",
        "metadata": {"name": "nb-0", "namespace": "ml"},
        "spec": {"devices": ["0"], "force": False},
    }
    move = seen[-1].json()
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


SUSPENDED = {
    "namespace": "ml",
    "pod": "nb-0",
    "container": "main",
    "containerId": CONTAINER_ID,
    "suspended": [UUID0],
    "processes": [{"pid": 7, "gpuBytes": 1 << 30}],
    "hostBytes": 1 << 30,
}
RESUMED = {**{k: SUSPENDED[k] for k in ("namespace", "pod", "container", "containerId")},
           "resumed": {UUID0: UUID1}, "processes": [{"pid": 7, "gpuBytes": 1 << 30}]}  # fmt: skip
PROGRESS = {"op": "suspend", "running": True, "step": "locking", "processes": 2, "locked": 1}


def _suspend_handler(wrap: bool) -> Handler:
    """Answers a suspend, a resume or a progress GET; in a GPUMount's status if `wrap`."""

    def handler(request: Seen) -> Reply:
        if request.method == "GET":
            body: dict[str, Any] = {**PROGRESS, "op": request.path.rpartition("/")[2]}
        else:
            body = SUSPENDED if request.path.endswith("/suspend") else RESUMED
        return Reply(200, json={"kind": "GPUMount", "status": body} if wrap else body)

    return handler


@pytest.mark.parametrize("aggregated", [False, True], ids=["v1", "aggregated"])
def test_suspend_resume_and_their_progress(serve: Serve, aggregated: bool) -> None:
    """Typed on both faces: the POST's body holds only what was given (the agent applies
    its defaults), the progress is a GET on the same path, and the answers are models."""
    hm, seen = serve(_suspend_handler(aggregated), aggregated=aggregated)
    suspended = hm.suspend("ml", "nb-0", lock_timeout=5)
    assert (suspended.suspended, suspended.host_bytes) == ([UUID0], 1 << 30)
    hm.suspend("ml", "nb-0", "main")
    resumed = hm.resume("ml", "nb-0", "main", mount=["1"])
    assert resumed.resumed == {UUID0: UUID1} and resumed.processes[0].pid == 7
    hm.resume("ml", "nb-0")
    progress = hm.progress("ml", "nb-0", "resume", container="main")
    assert (progress.op, progress.running, progress.locked) == ("resume", True, 1)
    hm.progress("ml", "nb-0", "suspend")

    base = (
        "/apis/hotmount.io/v1alpha1/namespaces/ml/gpumounts/nb-0"
        if aggregated
        else ("/v1/namespaces/ml/pods/nb-0")
    )
    assert [(r.method, r.raw_path) for r in seen] == [
        ("POST", f"{base}/suspend"),
        ("POST", f"{base}/suspend"),
        ("POST", f"{base}/resume"),
        ("POST", f"{base}/resume"),
        ("GET", f"{base}/resume?container=main"),
        ("GET", f"{base}/suspend"),
    ]
    assert [r.json() for r in seen[:4]] == [
        {"lockTimeoutSeconds": 5.0},
        {"container": "main"},
        {"container": "main", "mount": ["1"]},
        {},
    ]


def test_a_suspend_over_the_lock_cap_is_refused_before_sending(serve: Serve) -> None:
    hm, seen = serve(_suspend_handler(False))
    with pytest.raises(InvalidRequest, match="less than or equal to 30"):
        hm.suspend("ml", "nb-0", lock_timeout=31)
    with pytest.raises(InvalidRequest):
        hm.resume("ml", "nb-0", container="Not_A_Name")
    assert seen == []


def test_a_progress_answer_that_is_not_one_is_an_error(serve: Serve) -> None:
    hm, _ = serve(lambda r: Reply(200, json={"running": "maybe"}))
    with pytest.raises(HotmountClientError, match="unexpected answer"):
        hm.progress("ml", "nb-0", "suspend")


@pytest.mark.parametrize(("code", "reason", "exc", "exit_code"), ERRORS, ids=[e[1] for e in ERRORS])
def test_every_status_reason_maps_to_an_exception_and_exit_code(
    code: int, reason: str, exc: type[HotmountClientError], exit_code: int, serve: Serve
) -> None:
    details = {"holders": [{"pid": 4242, "command": "python", "path": "/dev/nvidia0"}]}
    body = status(code, reason, f"it failed: {reason}", details)
    hm, _ = serve(lambda r: Reply(code, json=body))
    with pytest.raises(HotmountClientError) as err:
        hm.mount("ml", "nb-0", devices=["0"])
    assert type(err.value) is exc
    assert err.value.exit_code == exit_code
    assert (err.value.reason, err.value.code) == (reason, code)
    assert err.value.message == f"it failed: {reason}"
    if exc is Busy:
        assert err.value.holders[0]["pid"] == 4242


def test_the_api_servers_own_status_and_non_json_errors(serve: Serve) -> None:
    apiserver_status = {**status(403, "Forbidden", "gpumounts is forbidden"), "metadata": {}}
    hm, _ = serve(lambda r: Reply(403, json=apiserver_status), aggregated=True)
    with pytest.raises(Forbidden, match="forbidden"):
        hm.status("ml", "nb-0")
    hm, _ = serve(lambda r: Reply(502, text="<html>bad gateway</html>"))
    with pytest.raises(Unavailable) as err:
        hm.status("ml", "nb-0")
    assert err.value.reason == "BadGateway" and "bad gateway" in err.value.message


def test_http_timeouts_and_connection_failures() -> None:
    answered = threading.Event()

    def slow(request: Seen) -> Reply:
        answered.wait(10)  # longer than the client waits; released when the test ends
        return Reply(200, json=mount_result())

    with RecordingServer(slow) as server:
        http = http_client(server.url, timeout=0.2)
        with HotmountClient(AgentTransport(http, "the agent")) as hm:
            with pytest.raises(Timeout) as err:
                hm.mount("ml", "nb-0", count=1)
            answered.set()
    assert err.value.exit_code == 6 and err.value.reason == "Timeout"
    # Nothing listens on the port a closed server had.
    with (
        HotmountClient.for_agent(server.url, timeout=5) as hm,
        pytest.raises(Unavailable) as unavailable,
    ):
        hm.list_devices()
    assert unavailable.value.exit_code == 1
    assert "refused" in unavailable.value.message.lower()


def test_bad_requests_are_refused_before_sending(serve: Serve) -> None:
    hm, seen = serve(lambda r: Reply(200, json=mount_result()))
    with pytest.raises(InvalidRequest, match="either devices or count"):
        hm.mount("ml", "nb-0", devices=["0"], count=1)
    with pytest.raises(InvalidRequest):
        hm.mount("ml", "nb-0", devices=["/dev/sda"])
    with pytest.raises(InvalidRequest):
        hm.move("0", ("Bad_NS", "p"), ("b", "q"))
    assert seen == []


def test_an_answer_that_does_not_match_the_schema(serve: Serve) -> None:
    hm, _ = serve(lambda r: Reply(200, json={"unexpected": True}))
    with pytest.raises(HotmountClientError, match="unexpected answer"):
        hm.status("ml", "nb-0")


# -- no bearer token in clear text over a network ---------------------------------------------


@pytest.mark.parametrize(
    "url", ["http://gpu-hotmount.gpu-hotmount.svc", "http://10.0.0.7:8443", "http://[fd00::7]"]
)
def test_for_agent_refuses_a_token_over_plain_http_to_another_host(url: str) -> None:
    """As nvcli refuses `--agent http://... --token`: there is no opt-in, only loopback."""
    with pytest.raises(ValueError, match="clear text"):
        HotmountClient.for_agent(url, "s3cret")


@pytest.mark.parametrize("url", ["http://127.0.0.1:8080", "http://localhost:9", "http://[::1]:80"])
def test_for_agent_allows_plain_http_to_this_machine(url: str) -> None:
    with HotmountClient.for_agent(url, "s3cret"):
        pass


def test_for_agent_without_a_token_sends_nothing_to_protect() -> None:
    with HotmountClient.for_agent("http://10.0.0.7:8443"):
        pass
