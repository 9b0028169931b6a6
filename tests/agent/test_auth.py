"""Who may call: 401 and 403 on every entry path, through real agent processes.

Direct bearer tokens (TokenReview, audiences, SubjectAccessReview), X-Remote-*
identity headers without the front proxy's client certificate, X-Hotmount-User
assertions from anyone but the agents, and standalone mode's token file and
root-only unix socket. Every refusal must leave the container untouched.
"""

from __future__ import annotations

import json
import stat
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.agent.conftest import AGENT_TOKEN, ALICE, BOB, Cluster
from tests.fakes.pki import CertificateAuthority
from tests.support.agent import GPUS, AgentProcess, standalone_agent, write_driver_tree
from tests.support.runc import RuncContainer

pytestmark = pytest.mark.kernel
GPU0 = f"/dev/nvidia{GPUS[0].minor}"  # index 0 is minor 3
MOUNT = "/v1/namespaces/default/pods/nb/devices"
REMOTE_ALICE = {"x-remote-user": "alice", "x-remote-group": "ml"}


def assert_status(response: httpx.Response, code: int, reason: str) -> dict[str, Any]:
    assert response.status_code == code, response.text
    body = response.json()
    assert body["kind"] == "Status" and body["status"] == "Failure"
    assert (body["code"], body["reason"]) == (code, reason)
    return body


def log_lines(agent: AgentProcess) -> list[dict[str, Any]]:
    lines = []
    for line in agent.log.read_text().splitlines():
        try:
            lines.append(json.loads(line))
        except ValueError:
            continue
    return lines


def audit(agent: AgentProcess) -> list[str]:
    return [e["msg"] for e in log_lines(agent) if e.get("logger") == "hotmount.audit"]


# -- 1. direct bearer tokens ---------------------------------------------------------------


def test_direct_bearer_401_403_then_200(cluster: Cluster) -> None:
    container = cluster.pod("nb")
    agent = cluster.agent()
    body = {"devices": ["0"]}

    with agent.client() as anonymous:
        assert_status(anonymous.post(MOUNT, json=body), 401, "Unauthorized")
        assert_status(anonymous.get(MOUNT), 401, "Unauthorized")
        assert_status(anonymous.get("/v1/devices"), 401, "Unauthorized")
        not_bearer = anonymous.post(MOUNT, json=body, headers={"authorization": "Basic YTpi"})
        assert_status(not_bearer, 401, "Unauthorized")
    with agent.client("no-such-token") as stranger:
        assert_status(stranger.post(MOUNT, json=body), 401, "Unauthorized")
    with agent.client(BOB) as bob:
        denied = assert_status(bob.post(MOUNT, json=body), 403, "Forbidden")
        assert "bob" in denied["message"] and "default/nb" in denied["message"]
        assert_status(bob.get(MOUNT), 403, "Forbidden")
        assert_status(bob.delete(f"{MOUNT}/0"), 403, "Forbidden")
    assert container.open_result(GPU0) == "ENOENT"
    assert not cluster.events("GPUMounted")

    with agent.client(ALICE) as alice:
        mounted = alice.post(MOUNT, json=body)
        assert mounted.status_code == 200, mounted.text
        assert container.open_result(GPU0) == "ENXIO"
        assert alice.get(MOUNT).status_code == 200
        # bob still may not take it away
        with agent.client(BOB) as bob:
            assert_status(bob.delete(f"{MOUNT}/0"), 403, "Forbidden")
        assert container.open_result(GPU0) == "ENXIO"
        assert alice.delete(f"{MOUNT}/0").status_code == 200
    assert container.open_result(GPU0) == "ENOENT"

    # every decision is logged, as JSON, with the user, the verb and the pod
    decisions = audit(agent)
    assert any(
        m.startswith("deny user=bob via=token verb=create pod=default/nb") for m in decisions
    ), decisions
    assert any(m.startswith("deny user=bob via=token verb=get pod=default/nb") for m in decisions)
    assert any(
        m.startswith("allow user=alice via=token verb=create pod=default/nb") for m in decisions
    )
    refusals = [e for e in log_lines(agent) if e["msg"].startswith("refused ")]
    assert any(": 401 " in e["msg"] for e in refusals) and any(
        ": 403 " in e["msg"] for e in refusals
    )


def test_token_audience(cluster: Cluster) -> None:
    container = cluster.pod("nb")
    cluster.kube.add_token("alice-for-hotmount", "alice", ["ml"], audiences=["hotmount"])
    agent = cluster.agent(extra=["--token-audiences", "hotmount"])

    with agent.client(ALICE) as wrong_audience:  # minted for the API server only
        refused = assert_status(
            wrong_audience.post(MOUNT, json={"devices": ["0"]}), 401, "Unauthorized"
        )
        assert "audience" in refused["message"]
    assert container.open_result(GPU0) == "ENOENT"

    with agent.client("alice-for-hotmount") as alice:
        mounted = alice.post(MOUNT, json={"devices": ["0"]})
        assert mounted.status_code == 200, mounted.text
    assert container.open_result(GPU0) == "ENXIO"


# -- 2. request-header identity without the front proxy's certificate -----------------------


def test_remote_user_headers_on_plain_http_are_401(cluster: Cluster) -> None:
    container = cluster.pod("nb")
    agent = cluster.agent()
    with agent.client() as bare:
        assert_status(
            bare.post(MOUNT, json={"devices": ["0"]}, headers=REMOTE_ALICE), 401, "Unauthorized"
        )
        assert_status(bare.get(MOUNT, headers=REMOTE_ALICE), 401, "Unauthorized")
    # not even next to a valid token: the headers would claim someone else
    with agent.client(BOB) as bob:
        assert_status(
            bob.post(MOUNT, json={"devices": ["0"]}, headers=REMOTE_ALICE), 401, "Unauthorized"
        )
    assert container.open_result(GPU0) == "ENOENT"


def test_remote_user_headers_on_tls_need_the_front_proxy_cert(cluster: Cluster) -> None:
    container = cluster.pod("nb")
    backend = cluster.aggregated_agent()
    body = {"devices": ["0"]}

    with backend.client() as no_cert:
        assert_status(no_cert.post(MOUNT, json=body, headers=REMOTE_ALICE), 401, "Unauthorized")

    # the right name, the wrong CA: the handshake fails, or at the least no trust
    impostor_ca = CertificateAuthority(cluster.workdir / "impostor", "impostor-ca")
    impostor = impostor_ca.issue_client("front-proxy-client")
    with backend.client(impostor) as forged:
        try:
            answer = forged.post(MOUNT, json=body, headers=REMOTE_ALICE)
        except (httpx.ConnectError, httpx.ReadError, httpx.RemoteProtocolError):
            pass
        else:
            assert_status(answer, 401, "Unauthorized")

    # the right CA, a name not in requestheader-allowed-names
    other_name = backend.requestheader_ca.issue_client("not-the-front-proxy")
    with backend.client(other_name) as wrong_name:
        assert_status(wrong_name.post(MOUNT, json=body, headers=REMOTE_ALICE), 401, "Unauthorized")
    with backend.client(backend.front_proxy) as proxy:  # but no X-Remote-User at all
        assert_status(
            proxy.post(MOUNT, json=body, headers={"x-remote-group": "ml"}), 401, "Unauthorized"
        )
    assert container.open_result(GPU0) == "ENOENT"

    # control: the genuine front-proxy certificate is trusted, and bob is still bob
    with backend.client(backend.front_proxy) as proxy:
        bob = proxy.post(MOUNT, json=body, headers={"x-remote-user": "bob"})
        assert_status(bob, 403, "Forbidden")
        assert container.open_result(GPU0) == "ENOENT"
        alice = proxy.post(MOUNT, json=body, headers=REMOTE_ALICE)
        assert alice.status_code == 200, alice.text
    assert container.open_result(GPU0) == "ENXIO"
    assert any(m.startswith("allow user=alice via=front-proxy") for m in audit(backend.agent))


# -- 3. gateway assertions -------------------------------------------------------------------


def test_identity_assertions_only_from_the_agents(cluster: Cluster) -> None:
    container = cluster.pod("nb")
    agent = cluster.agent()
    as_alice = {"x-hotmount-user": "alice", "x-hotmount-group": "ml"}
    body = {"devices": ["0"]}

    with agent.client() as bare:
        assert_status(bare.post(MOUNT, json=body, headers=as_alice), 401, "Unauthorized")
    with agent.client(ALICE) as alice:  # a valid token, but not an agent's
        assert_status(alice.post(MOUNT, json=body, headers=as_alice), 401, "Unauthorized")
    with agent.client(BOB) as bob:  # bob claiming to be alice
        assert_status(bob.post(MOUNT, json=body, headers=as_alice), 401, "Unauthorized")
    assert container.open_result(GPU0) == "ENOENT"

    with agent.client(AGENT_TOKEN) as agents:
        # the agents' own token is trusted to assert, and the asserted user is authorized
        assert_status(
            agents.post(MOUNT, json=body, headers={"x-hotmount-user": "bob"}), 403, "Forbidden"
        )
        assert container.open_result(GPU0) == "ENOENT"
        mounted = agents.post(MOUNT, json=body, headers=as_alice)
        assert mounted.status_code == 200, mounted.text
    assert container.open_result(GPU0) == "ENXIO"
    decisions = audit(agent)
    assert any(m.startswith("deny user=bob via=gateway verb=create") for m in decisions)
    assert any(m.startswith("allow user=alice via=gateway verb=create") for m in decisions)


# -- 4. standalone: the token file and the unix socket ------------------------------------------


def test_standalone_token_file_and_unix_socket(tmp_path: Path, rootfs: Path, cdi_dir: Path) -> None:
    container = RuncContainer(tmp_path, rootfs, "v1")
    agent: AgentProcess | None = None
    try:
        token_file = tmp_path / "token"
        token_file.write_text("s3cret-standalone-token\n")
        socket_path = tmp_path / "run" / "agent.sock"
        agent = standalone_agent(
            tmp_path,
            write_driver_tree(tmp_path / "driver"),
            cdi_dir,
            ["--listen", f"unix:{socket_path}", "--token-file", str(token_file)],
        )
        devices = f"/v1/containers/{container.id}/devices"

        with agent.client() as bare:
            assert_status(bare.post(devices, json={"devices": ["0"]}), 401, "Unauthorized")
            assert_status(bare.get(devices), 401, "Unauthorized")
        with agent.client("wrong-token") as wrong:
            assert_status(wrong.post(devices, json={"devices": ["0"]}), 401, "Unauthorized")
            assert_status(wrong.delete(f"{devices}/0"), 401, "Unauthorized")
        # Kubernetes identities mean nothing here: there is nobody to review them
        with agent.client(AGENT_TOKEN) as kube_token:
            assert_status(
                kube_token.post(
                    devices, json={"devices": ["0"]}, headers={"x-hotmount-user": "alice"}
                ),
                401,
                "Unauthorized",
            )
        assert container.open_result(GPU0) == "ENOENT"

        with agent.client("s3cret-standalone-token") as api:
            mounted = api.post(devices, json={"devices": ["0"]})
            assert mounted.status_code == 200, mounted.text
            assert mounted.json()["containerId"] == container.id
            assert [d["paths"] for d in mounted.json()["mounted"]] == [[GPU0]]
            assert container.open_result(GPU0) == "ENXIO"
            listed = api.get(devices).json()
            assert [d["uuid"] for c in listed["containers"] for d in c["devices"]] == [GPUS[0].uuid]
            unmounted = api.delete(f"{devices}/0")
            assert unmounted.status_code == 200, unmounted.text
            assert unmounted.json()["unmounted"] == [GPUS[0].uuid]
        assert container.open_result(GPU0) == "ENOENT"

        # the unix socket: root only (0600), no token needed
        mode = socket_path.stat().st_mode
        assert stat.S_ISSOCK(mode) and stat.S_IMODE(mode) == 0o600
        transport = httpx.HTTPTransport(uds=str(socket_path))
        with httpx.Client(transport=transport, base_url="http://agent", timeout=60) as local:
            mounted = local.post(devices, json={"devices": ["0"]})
            assert mounted.status_code == 200, mounted.text
            assert container.open_result(GPU0) == "ENXIO"
            assert local.get(devices).status_code == 200
            assert local.delete(f"{devices}/0").status_code == 200
        assert container.open_result(GPU0) == "ENOENT"
        assert any(m.startswith("allow user=system:node-local:root via=unix") for m in audit(agent))
    finally:
        if agent is not None:
            agent.stop()
        container.stop()
