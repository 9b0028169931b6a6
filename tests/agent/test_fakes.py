"""The fakes behave like the real kube-apiserver and kubelet, through the real clients.

Everything here goes over real HTTP(S) or gRPC: the official ``kubernetes``
client, httpx and the generated PodResources stubs.
"""

from __future__ import annotations

import json
import ssl
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException

from agent.podresources import Allocation, PodResourcesClient, PodResourcesError
from agent.podresources.generated import api_pb2, api_pb2_grpc
from tests.fakes import (
    AccessRule,
    CertificateAuthority,
    FakeKubeApiServer,
    FakePodResourcesServer,
    FrontProxy,
)
from tests.support.waiting import wait_for

GPU = "nvidia.com/gpu"
NODE_A_GPUS = [
    "GPU-aaaaaaaa-0000-0000-0000-000000000001",
    "GPU-aaaaaaaa-0000-0000-0000-000000000002",
]
NODE_B_GPUS = ["GPU-bbbbbbbb-0000-0000-0000-000000000001"]
AGENT_SA = "system:serviceaccount:gpu-hotmount:agent"


def status_of(err: ApiException) -> dict[str, Any]:
    return json.loads(err.body)


def pod_body(
    name: str,
    gpus: int = 0,
    *,
    node_name: str | None = None,
    hostname: str | None = None,
    labels: dict[str, str] | None = None,
) -> k8s.V1Pod:
    resources = k8s.V1ResourceRequirements(limits={GPU: str(gpus)}) if gpus else None
    return k8s.V1Pod(
        metadata=k8s.V1ObjectMeta(name=name, labels=labels),
        spec=k8s.V1PodSpec(
            node_name=node_name,
            node_selector={"kubernetes.io/hostname": hostname} if hostname else None,
            containers=[k8s.V1Container(name="main", image="busybox", resources=resources)],
        ),
    )


@pytest.fixture
def kubelet() -> Iterator[FakePodResourcesServer]:
    with FakePodResourcesServer() as server:
        yield server


@pytest.fixture
def apiserver(tmp_path: Path, kubelet: FakePodResourcesServer) -> Iterator[FakeKubeApiServer]:
    fake = FakeKubeApiServer.with_tls(
        tmp_path / "pki",
        nodes={"node-a": NODE_A_GPUS, "node-b": NODE_B_GPUS},
        podresources={"node-a": kubelet},
    )
    with fake:
        yield fake


@pytest.fixture
def core(apiserver: FakeKubeApiServer) -> Iterator[k8s.CoreV1Api]:
    with apiserver.api_client() as api:
        yield k8s.CoreV1Api(api)


# -- pods ------------------------------------------------------------------------------


def test_pod_create_get_list_delete(core: k8s.CoreV1Api) -> None:
    created = core.create_namespaced_pod("ml", pod_body("nb-0", labels={"app": "nb"}))
    core.create_namespaced_pod("other", pod_body("web", hostname="node-b", labels={"app": "web"}))
    assert created.metadata.uid and created.metadata.namespace == "ml"

    assert core.read_namespaced_pod("nb-0", "ml").metadata.labels == {"app": "nb"}
    assert [p.metadata.name for p in core.list_namespaced_pod("ml").items] == ["nb-0"]
    everywhere = core.list_pod_for_all_namespaces()
    assert sorted(p.metadata.name for p in everywhere.items) == ["nb-0", "web"]
    on_b = core.list_pod_for_all_namespaces(field_selector="spec.nodeName=node-b")
    assert [p.metadata.name for p in on_b.items] == ["web"]
    by_label = core.list_pod_for_all_namespaces(label_selector="app=nb")
    assert [p.metadata.name for p in by_label.items] == ["nb-0"]
    not_nb = core.list_pod_for_all_namespaces(label_selector="app!=nb")
    assert [p.metadata.name for p in not_nb.items] == ["web"]

    core.delete_namespaced_pod("nb-0", "ml", grace_period_seconds=0)
    with pytest.raises(ApiException) as err:
        core.read_namespaced_pod("nb-0", "ml")
    assert err.value.status == 404
    assert status_of(err.value)["reason"] == "NotFound"
    assert status_of(err.value)["message"] == 'pods "nb-0" not found'


def test_pod_conflict_and_bad_selector(core: k8s.CoreV1Api) -> None:
    core.create_namespaced_pod("ml", pod_body("dup"))
    with pytest.raises(ApiException) as err:
        core.create_namespaced_pod("ml", pod_body("dup"))
    assert err.value.status == 409
    assert status_of(err.value)["reason"] == "AlreadyExists"

    with pytest.raises(ApiException) as bad:
        core.list_pod_for_all_namespaces(field_selector="spec.bogus=x")
    assert bad.value.status == 400

    with pytest.raises(ApiException) as missing:
        core.delete_namespaced_pod("nope", "ml")
    assert missing.value.status == 404


def test_unauthenticated_and_forbidden_callers(apiserver: FakeKubeApiServer) -> None:
    apiserver.add_token("carol-token", "carol", ["viewers"])
    apiserver.allow(AccessRule(group="viewers", verb="list", resource="pods", namespace="ml"))

    with apiserver.api_client(token="no-such-token") as api, pytest.raises(ApiException) as err:
        k8s.CoreV1Api(api).list_namespaced_pod("ml")
    assert err.value.status == 401
    assert status_of(err.value)["reason"] == "Unauthorized"

    with apiserver.api_client(token="carol-token") as api:
        v1 = k8s.CoreV1Api(api)
        assert v1.list_namespaced_pod("ml").items == []
        with pytest.raises(ApiException) as forbidden:
            v1.list_namespaced_pod("kube-system")
    assert forbidden.value.status == 403
    assert status_of(forbidden.value)["message"] == (
        'pods is forbidden: User "carol" cannot list resource "pods" in API group "" '
        'in the namespace "kube-system"'
    )


def test_client_certificate_kubeconfig(apiserver: FakeKubeApiServer, tmp_path: Path) -> None:
    assert apiserver.ca is not None
    alice = apiserver.ca.issue_client("alice", groups=["devs"])
    apiserver.allow(AccessRule(group="devs", verb="get", resource="pods"))
    with apiserver.api_client() as admin:
        k8s.CoreV1Api(admin).create_namespaced_pod("ml", pod_body("nb-0"))

    kubeconfig = apiserver.write_kubeconfig(tmp_path / "kubeconfig", cert=alice)
    with k8s_config.new_client_from_config(config_file=str(kubeconfig)) as api:
        v1 = k8s.CoreV1Api(api)
        assert v1.read_namespaced_pod("nb-0", "ml").metadata.name == "nb-0"
        with pytest.raises(ApiException) as err:
            v1.list_namespaced_pod("ml")  # only `get` was granted to the group
    assert err.value.status == 403
    assert 'User "alice"' in status_of(err.value)["message"]

    token_config = apiserver.write_kubeconfig(tmp_path / "admin", token=apiserver.admin_token)
    with k8s_config.new_client_from_config(config_file=str(token_config)) as api:
        assert len(k8s.CoreV1Api(api).list_pod_for_all_namespaces().items) == 1


# -- events and configmaps ---------------------------------------------------------------


def test_events_are_stored_and_listed(apiserver: FakeKubeApiServer, core: k8s.CoreV1Api) -> None:
    event = k8s.CoreV1Event(
        metadata=k8s.V1ObjectMeta(generate_name="nb-0."),
        involved_object=k8s.V1ObjectReference(kind="Pod", namespace="ml", name="nb-0"),
        reason="GPUMounted",
        message="mounted GPU-aaaa into container main",
        type="Normal",
    )
    created = core.create_namespaced_event("ml", event)
    assert created.metadata.name.startswith("nb-0.")

    listed = core.list_namespaced_event("ml", field_selector="involvedObject.name=nb-0")
    assert [e.reason for e in listed.items] == ["GPUMounted"]
    assert core.list_namespaced_event("ml", field_selector="involvedObject.name=x").items == []
    assert [e["reason"] for e in apiserver.events("ml")] == ["GPUMounted"]


def test_authentication_configmap_carries_request_header_ca(
    apiserver: FakeKubeApiServer, core: k8s.CoreV1Api, tmp_path: Path
) -> None:
    front_ca = CertificateAuthority(tmp_path / "front", "front-proxy-ca")
    apiserver.configure_front_proxy(
        FrontProxy(
            backend_url="https://127.0.0.1:1",
            client=front_ca.issue_client("front-proxy-client"),
            backend_ca=front_ca.cert_path,
        )
    )
    cm = core.read_namespaced_config_map("extension-apiserver-authentication", "kube-system")
    assert cm.data["requestheader-client-ca-file"] == front_ca.pem()
    assert json.loads(cm.data["requestheader-allowed-names"]) == ["front-proxy-client"]
    assert cm.data["client-ca-file"].startswith("-----BEGIN CERTIFICATE-----")


# -- TokenReview and SubjectAccessReview -------------------------------------------------


def test_token_review_honours_audiences(apiserver: FakeKubeApiServer) -> None:
    apiserver.add_token("agent-token", AGENT_SA)
    apiserver.allow_auth_delegation(AGENT_SA)
    apiserver.add_token(
        "nb-token",
        "system:serviceaccount:ml:nb",
        ["system:serviceaccounts"],
        audiences=["hotmount"],
    )

    def review(token: str, audiences: list[str] | None) -> k8s.V1TokenReviewStatus:
        body = k8s.V1TokenReview(spec=k8s.V1TokenReviewSpec(token=token, audiences=audiences))
        return auth.create_token_review(body).status

    with apiserver.api_client(token="agent-token") as api:
        auth = k8s.AuthenticationV1Api(api)
        ok = review("nb-token", ["hotmount", "other"])
        wrong_audience = review("nb-token", ["other"])
        api_audience = review("nb-token", None)  # defaults to the API server's audiences
        unknown = review("forged", ["hotmount"])

    assert ok.authenticated is True
    assert ok.audiences == ["hotmount"]
    assert ok.user.username == "system:serviceaccount:ml:nb"
    assert ok.user.groups == ["system:serviceaccounts", "system:authenticated"]
    assert not wrong_audience.authenticated
    assert "invalid for the target audiences" in wrong_audience.error
    assert not api_audience.authenticated
    assert not unknown.authenticated
    # A token minted for another audience does not log in to the API server either.
    with apiserver.api_client(token="nb-token") as api, pytest.raises(ApiException) as err:
        k8s.CoreV1Api(api).list_namespaced_pod("ml")
    assert err.value.status == 401


def test_token_review_needs_permission(apiserver: FakeKubeApiServer) -> None:
    apiserver.add_token("plain", "plain-user")
    body = k8s.V1TokenReview(spec=k8s.V1TokenReviewSpec(token="plain"))
    with apiserver.api_client(token="plain") as api, pytest.raises(ApiException) as err:
        k8s.AuthenticationV1Api(api).create_token_review(body)
    assert err.value.status == 403


@pytest.mark.parametrize(
    "case",
    [
        ("bob", ["ml-team"], "create", "ml", True),
        ("bob", ["ml-team"], "create", "prod", False),
        ("bob", ["ml-team"], "delete", "ml", False),
        ("eve", [], "create", "ml", False),
        ("root", [], "delete", "prod", True),
    ],
    ids=["group-allowed", "other-namespace", "other-verb", "no-group", "user-wildcard"],
)
def test_subject_access_review(
    apiserver: FakeKubeApiServer, case: tuple[str, list[str], str, str, bool]
) -> None:
    user, groups, verb, namespace, allowed = case
    apiserver.allow(
        AccessRule(
            group="ml-team",
            verb="create",
            api_group="hotmount.io",
            resource="gpumounts",
            namespace="ml",
        )
    )
    apiserver.allow(AccessRule(user="root", api_group="hotmount.io"))
    body = k8s.V1SubjectAccessReview(
        spec=k8s.V1SubjectAccessReviewSpec(
            user=user,
            groups=groups,
            resource_attributes=k8s.V1ResourceAttributes(
                group="hotmount.io",
                resource="gpumounts",
                verb=verb,
                namespace=namespace,
                name="nb-0",
            ),
        )
    )
    with apiserver.api_client() as api:
        status = k8s.AuthorizationV1Api(api).create_subject_access_review(body).status
    assert status.allowed is allowed
    assert status.reason


# -- holder pods and PodResources ------------------------------------------------------------


def test_holder_pod_gets_devices_and_frees_them(
    apiserver: FakeKubeApiServer, core: k8s.CoreV1Api, kubelet: FakePodResourcesServer
) -> None:
    core.create_namespaced_pod("ml", pod_body("holder-1", gpus=2, hostname="node-a"))
    pod = core.read_namespaced_pod("holder-1", "ml")
    assert pod.status.phase == "Running"
    assert pod.spec.node_name == "node-a"
    assert pod.status.container_statuses[0].container_id.startswith("containerd://")

    with PodResourcesClient(kubelet.socket_path, timeout=2) as prc:
        assert prc.list_allocations() == [
            Allocation("ml", "holder-1", "main", GPU, tuple(NODE_A_GPUS))
        ]
        assert apiserver.free_devices("node-a") == []

        core.create_namespaced_pod("ml", pod_body("holder-2", gpus=1, hostname="node-a"))
        waiting = core.read_namespaced_pod("holder-2", "ml")
        assert waiting.status.phase == "Pending"
        [condition] = waiting.status.conditions
        assert (condition.type, condition.status, condition.reason) == (
            "PodScheduled",
            "False",
            "Unschedulable",
        )
        assert condition.message == (
            "0/2 nodes are available: 1 Insufficient nvidia.com/gpu, "
            "1 node(s) didn't match Pod's node affinity/selector."
        )

        deleted = core.delete_namespaced_pod("holder-1", "ml")
        assert deleted.metadata.deletion_grace_period_seconds == 30
        # The freed GPU goes to the waiting holder, as the scheduler would retry it.
        assert core.read_namespaced_pod("holder-2", "ml").status.phase == "Running"
        assert prc.list_allocations() == [
            Allocation("ml", "holder-2", "main", GPU, (NODE_A_GPUS[0],))
        ]
    assert apiserver.free_devices("node-a") == [NODE_A_GPUS[1]]


def test_holder_bound_by_node_name_is_rejected_by_kubelet(core: k8s.CoreV1Api) -> None:
    core.create_namespaced_pod("ml", pod_body("greedy", gpus=2, node_name="node-b"))
    pod = core.read_namespaced_pod("greedy", "ml")
    assert pod.status.phase == "Failed"
    assert pod.status.reason == "OutOfnvidia.com/gpu"
    assert "requested: 2, used: 0, capacity: 1" in pod.status.message


def test_running_delay_and_graceful_termination(
    tmp_path: Path, kubelet: FakePodResourcesServer
) -> None:
    fake = FakeKubeApiServer(
        nodes={"node-a": NODE_A_GPUS},
        podresources={"node-a": kubelet},
        running_delay=0.3,
        termination_seconds=0.3,
    )
    with fake, fake.api_client() as api:
        v1 = k8s.CoreV1Api(api)
        assert fake.url.startswith("http://")
        v1.create_namespaced_pod("ml", pod_body("h", gpus=1, node_name="node-a"))
        assert v1.read_namespaced_pod("h", "ml").status.phase == "Pending"
        assert kubelet.allocations() == {("ml", "h"): {"main": {GPU: [NODE_A_GPUS[0]]}}}
        wait_for(
            lambda: v1.read_namespaced_pod("h", "ml").status.phase == "Running",
            "pod ml/h to turn Running after its running_delay",
            timeout=5,
            interval=0.02,
        )

        deleted = v1.delete_namespaced_pod("h", "ml", grace_period_seconds=5)
        assert deleted.metadata.deletion_timestamp is not None
        assert v1.read_namespaced_pod("h", "ml").metadata.deletion_grace_period_seconds == 5
        wait_for(
            lambda: not v1.list_namespaced_pod("ml").items,
            "pod ml/h to go once its termination_seconds passed",
            timeout=5,
            interval=0.02,
        )
        assert kubelet.allocations() == {}
        assert fake.free_devices("node-a") == NODE_A_GPUS


def test_allocatable_reports_pool_or_unknown(
    apiserver: FakeKubeApiServer, kubelet: FakePodResourcesServer
) -> None:
    with PodResourcesClient(kubelet.socket_path, timeout=2) as prc:
        assert prc.allocatable(GPU) == NODE_A_GPUS
        assert prc.allocatable("example.com/fpga") == []
        kubelet.allocatable_unimplemented = True  # a 1.20 kubelet
        assert prc.allocatable(GPU) is None


def test_podresources_errors_are_mapped(tmp_path: Path) -> None:
    with PodResourcesClient(str(tmp_path / "absent.sock"), timeout=0.5) as prc:
        with pytest.raises(PodResourcesError) as err:
            prc.list_allocations()
        assert err.value.code == grpc.StatusCode.UNAVAILABLE
        assert "absent.sock" in str(err.value)
        with pytest.raises(PodResourcesError):
            prc.allocatable(GPU)


def test_fake_kubelet_get_method(kubelet: FakePodResourcesServer) -> None:
    kubelet.set_allocation("ml", "nb-0", "main", GPU, ["GPU-x"])
    with grpc.insecure_channel(f"unix://{kubelet.socket_path}") as channel:
        stub = api_pb2_grpc.PodResourcesListerStub(channel)
        got = stub.Get(api_pb2.GetPodResourcesRequest(pod_name="nb-0", pod_namespace="ml"))
        assert list(got.pod_resources.containers[0].devices[0].device_ids) == ["GPU-x"]
        with pytest.raises(grpc.RpcError) as err:
            stub.Get(api_pb2.GetPodResourcesRequest(pod_name="gone", pod_namespace="ml"))
        assert err.value.code() == grpc.StatusCode.UNKNOWN


# -- aggregated API front proxy ----------------------------------------------------------------


class _EchoBackend:
    """A TLS aggregated API server that demands a client cert and echoes what it got."""

    def __init__(self, serving_ca: CertificateAuthority, requestheader_ca: Path) -> None:
        received: list[dict[str, Any]] = []
        self.received = received

        class Handler(BaseHTTPRequestHandler):
            def _echo(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                peer = self.connection.getpeercert()
                subject = dict(attr for rdn in peer["subject"] for attr in rdn)
                received.append(
                    {
                        "method": self.command,
                        "path": self.path,
                        "body": body.decode(),
                        "user": self.headers.get_all("X-Remote-User"),
                        "groups": self.headers.get_all("X-Remote-Group"),
                        "authorization": self.headers.get("Authorization"),
                        "peer_cn": subject["commonName"],
                    }
                )
                payload = json.dumps({"echo": self.path}).encode()
                self.send_response(201 if self.command == "POST" else 200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            do_GET = do_POST = _echo  # noqa: N815

            def log_message(self, format: str, *args: Any) -> None:
                pass

        serving = serving_ca.issue_server("hotmount-agent")
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(serving.cert, serving.key)
        context.load_verify_locations(cafile=str(requestheader_ca))
        context.verify_mode = ssl.CERT_REQUIRED
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        self.url = f"https://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    def __enter__(self) -> _EchoBackend:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()


def test_front_proxy_forwards_identity_not_credentials(
    apiserver: FakeKubeApiServer, tmp_path: Path
) -> None:
    assert apiserver.ca is not None and apiserver.ca_path is not None
    front_ca = CertificateAuthority(tmp_path / "front", "front-proxy-ca")
    backend_ca = CertificateAuthority(tmp_path / "backend", "agent-serving-ca")
    apiserver.add_token("alice-token", "alice", ["ml-team"])
    apiserver.allow(
        AccessRule(
            group="ml-team",
            verb="create",
            api_group="hotmount.io",
            resource="gpumounts",
            namespace="ml",
        )
    )
    dave = apiserver.ca.issue_client("dave", groups=["ml-team", "ops"])
    trust = ssl.create_default_context(cafile=str(apiserver.ca_path))

    with _EchoBackend(backend_ca, front_ca.cert_path) as backend:
        apiserver.configure_front_proxy(
            FrontProxy(
                backend_url=backend.url,
                client=front_ca.issue_client("front-proxy-client"),
                backend_ca=backend_ca.cert_path,
            )
        )
        path = "/apis/hotmount.io/v1alpha1/namespaces/ml/gpumounts?dryRun=All"
        with httpx.Client(base_url=apiserver.url, verify=trust) as http:
            created = http.post(
                path,
                content=b'{"count": 1}',
                headers={"Authorization": "Bearer alice-token", "X-Remote-User": "spoofed-admin"},
            )
            discovery = http.get(
                "/apis/hotmount.io/v1alpha1", headers={"Authorization": "Bearer alice-token"}
            )
            anonymous = http.get("/apis/hotmount.io/v1alpha1")
            denied = http.delete(
                "/apis/hotmount.io/v1alpha1/namespaces/ml/gpumounts/x",
                headers={"Authorization": "Bearer alice-token"},
            )
        cert_ctx = ssl.create_default_context(cafile=str(apiserver.ca_path))
        cert_ctx.load_cert_chain(str(dave.cert), str(dave.key))
        with httpx.Client(base_url=apiserver.url, verify=cert_ctx) as http:
            by_cert = http.post("/apis/hotmount.io/v1alpha1/namespaces/ml/gpumounts", content=b"{}")

    assert created.status_code == 201
    assert created.json() == {"echo": path}
    assert discovery.status_code == 200
    assert anonymous.status_code == 401
    assert denied.status_code == 403
    assert by_cert.status_code == 201
    first, second, third = backend.received
    assert first == {
        "method": "POST",
        "path": path,
        "body": '{"count": 1}',
        "user": ["alice"],
        "groups": ["ml-team", "system:authenticated"],
        "authorization": None,
        "peer_cn": "front-proxy-client",
    }
    assert second["path"] == "/apis/hotmount.io/v1alpha1"
    assert third["user"] == ["dave"]
    assert third["groups"] == ["ml-team", "ops", "system:authenticated"]


def test_stop_releases_port_and_threads(tmp_path: Path) -> None:
    fake = FakeKubeApiServer.with_tls(tmp_path).start()
    with fake.api_client() as api:
        url = fake.url
        k8s.CoreV1Api(api).list_pod_for_all_namespaces()  # leaves a keep-alive connection open
        before = threading.active_count()
        fake.stop()  # must not wait for the client to hang up
        assert threading.active_count() < before
    assert not [t for t in threading.enumerate() if t.name == "fake-apiserver"]
    with pytest.raises(httpx.ConnectError):
        httpx.get(url, verify=False)


def test_a_call_the_kubelets_rate_limit_refuses_is_tried_again(
    kubelet: FakePodResourcesServer,
) -> None:
    """The kubelet refuses PodResources calls past 100 a second with RESOURCE_EXHAUSTED;
    the client tries again after a short pause, and fails only when refused throughout."""
    kubelet.set_allocation("ml", "nb-0", "main", GPU, ["GPU-x"])
    kubelet.set_allocatable(GPU, ["GPU-x", "GPU-y"])
    with PodResourcesClient(kubelet.socket_path, timeout=5) as prc:
        kubelet.refuse_next = 3
        assert [a.pod_name for a in prc.list_allocations()] == ["nb-0"]
        kubelet.refuse_next = 2
        assert prc.allocatable(GPU) == ["GPU-x", "GPU-y"]
        assert kubelet.refused == 5
        kubelet.refuse_next = 100
        with pytest.raises(PodResourcesError) as err:
            prc.list_allocations()
        assert err.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
