"""The aggregated-API path: kubeconfig credentials -> API server -> front proxy -> agent.

The fake API server authenticates nvcli's client certificate, static token or
exec-plugin token, authorizes with its rule table, strips `Authorization` and
forwards the identity in X-Remote-* headers over TLS with its front-proxy
client certificate, as kube-apiserver does.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml

from cli.client import Forbidden, HotmountClient, NotFound, Unauthorized
from tests.cli.conftest import Cluster
from tests.cli.stub_agent import GPUS

PREFIX = "/apis/hotmount.io/v1alpha1"


def exec_kubeconfig(cluster: Cluster, token: str) -> Path:
    """A kubeconfig whose user is an exec plugin (as EKS, GKE, OIDC helpers are)."""
    path = cluster.kubeconfig("exec-config", namespace="ml", token="unused")
    config = yaml.safe_load(path.read_text())
    credential = {
        "apiVersion": "client.authentication.k8s.io/v1beta1",
        "kind": "ExecCredential",
        "status": {"token": token},
    }
    config["users"][0]["user"] = {
        "exec": {
            "apiVersion": "client.authentication.k8s.io/v1beta1",
            "command": sys.executable,
            "args": ["-c", f"print({json.dumps(json.dumps(credential))})"],
            "interactiveMode": "Never",
        }
    }
    path.write_text(yaml.safe_dump(config))
    return path


def test_client_certificate_reaches_the_agent_as_x_remote_headers(cluster: Cluster) -> None:
    dave = cluster.ca.issue_client("dave", groups=["ml-team", "ops"])
    config = cluster.kubeconfig("cert-config", namespace="ml", cert=dave)
    with HotmountClient.from_kubeconfig(str(config)) as hm:
        result = hm.mount("ml", "nb-0", devices=["0"])
    assert result.mounted[0].uuid == GPUS[0]["uuid"]

    (req,) = cluster.agent.received
    assert (req.method, req.path) == ("POST", f"{PREFIX}/namespaces/ml/gpumounts")
    assert req.headers["x-remote-user"] == ["dave"]
    assert req.headers["x-remote-group"] == ["ml-team", "ops", "system:authenticated"]
    assert req.peer_cn == "front-proxy-client"
    assert "authorization" not in req.headers


def test_static_token(cluster: Cluster) -> None:
    config = cluster.kubeconfig("token-config", token="alice-token")
    with HotmountClient.from_kubeconfig(str(config)) as hm:
        assert hm.status("ml", "nb-0").containers[0].container == "main"
        assert [d.node for d in hm.list_devices()] == ["node-a"]
        hm.unmount("ml", "nb-0", devices=["1"], force=True)
        hm.move("0", ("ml", "nb-0"), ("ml", "nb-1"))
    assert [r.header("x-remote-user") for r in cluster.agent.received] == ["alice"] * 4
    delete = cluster.agent.received[2]
    assert delete.query == {"device": ["1"], "force": ["true"]}


def test_exec_plugin_token(cluster: Cluster) -> None:
    with HotmountClient.from_kubeconfig(str(exec_kubeconfig(cluster, "alice-token"))) as hm:
        hm.list_devices("node-a")
    (req,) = cluster.agent.received
    assert req.path == f"{PREFIX}/nodedevices/node-a"
    assert req.header("x-remote-user") == "alice"


def test_the_api_server_refuses_before_the_agent_sees_anything(cluster: Cluster) -> None:
    bad = cluster.kubeconfig("bad-token", token="no-such-token")
    with HotmountClient.from_kubeconfig(str(bad)) as hm, pytest.raises(Unauthorized):
        hm.list_devices()
    alice = cluster.kubeconfig("alice", token="alice-token")
    with HotmountClient.from_kubeconfig(str(alice)) as hm, pytest.raises(Forbidden) as err:
        hm.mount("kube-system", "etcd", devices=["0"])
    assert 'User "alice"' in err.value.message
    assert cluster.agent.received == []


def test_no_apiservice_is_a_not_found_with_a_hint(cluster: Cluster) -> None:
    cluster.apiserver.configure_front_proxy(None)
    config = cluster.kubeconfig("admin")
    with HotmountClient.from_kubeconfig(str(config)) as hm, pytest.raises(NotFound) as err:
        hm.list_devices()
    assert "could not find the requested resource" in err.value.message
