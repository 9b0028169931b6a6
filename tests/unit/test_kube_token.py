"""The agent's own token, to forward with, whichever way the client was configured."""

from __future__ import annotations

from pathlib import Path

from kubernetes import client
from kubernetes.config.incluster_config import InClusterConfigLoader

from agent.kube.client import KubeClient


def test_the_in_cluster_token_is_found(tmp_path: Path) -> None:
    """The in-cluster loader (every agent pod) writes `bearer <token>`, lower case: a
    token() that wanted `Bearer ` found none, and no list or mount was ever forwarded."""
    (tmp_path / "token").write_text("the-agents-token")
    (tmp_path / "ca.crt").write_text("not empty")
    configuration = client.Configuration()
    InClusterConfigLoader(
        token_filename=str(tmp_path / "token"),
        cert_filename=str(tmp_path / "ca.crt"),
        environ={"KUBERNETES_SERVICE_HOST": "10.0.0.1", "KUBERNETES_SERVICE_PORT": "443"},
    ).load_and_set(configuration)
    assert KubeClient(client.ApiClient(configuration)).token() == "the-agents-token"


def test_a_kubeconfig_token_is_found_and_none_is_none() -> None:
    configuration = client.Configuration()
    configuration.api_key["authorization"] = "Bearer from-kubeconfig"
    assert KubeClient(client.ApiClient(configuration)).token() == "from-kubeconfig"
    assert KubeClient(client.ApiClient(client.Configuration())).token() is None
