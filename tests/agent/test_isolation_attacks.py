"""A hostile namespace editor against issue 8's guarantees, over HTTP to a real agent.

Each test is one way a tenant could reach a GPU that another tenant's pod holds;
each failed before its fix.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest

from tests.agent.conftest import DANA, Cluster
from tests.fakes.podresources_server import FakePodResourcesServer
from tests.support.agent import GPUS

pytestmark = pytest.mark.kernel
GPU0 = GPUS[0]


def mount(api: Any, pod: str, namespace: str = "default", **body: Any) -> Any:
    return api.post(f"/v1/namespaces/{namespace}/pods/{pod}/devices", json=body)


def test_the_kubelet_check_fails_closed_when_podresources_does_not_answer(
    cluster: Cluster,
) -> None:
    """The kubelet gave GPU 0 to another tenant's pod; PodResources stops answering (a
    kubelet restart, its rate limit). A mount by name must not slip through unchecked."""
    nb = cluster.pod("nb")
    cluster.pod("trainer", namespace="team-b")
    kubelet = cluster.kubelets["node-a"]
    kubelet.set_allocation("team-b", "trainer", "main", "nvidia.com/gpu", [GPU0.uuid])
    agent = cluster.agent()
    with agent.client(DANA) as api:
        assert mount(api, "nb", devices=["0"]).json()["reason"] == "AllocatedToPod"
        kubelet.stop()

        refused = mount(api, "nb", devices=["0"])

        assert refused.status_code == 502, refused.text
        assert refused.json()["reason"] == "UpstreamError"
        assert "PodResources" in refused.json()["message"]
        assert f"nvidia{GPU0.minor}" not in nb.ls_dev()


def test_an_agent_started_before_the_kubelet_socket_still_checks_the_kubelet(
    cluster: Cluster, tmp_path: Path
) -> None:
    """The agent starts while the kubelet restarts (no PodResources socket yet). It must
    not serve for life as if the kubelet had given no GPU to anyone."""
    nb = cluster.pod("nb")
    cluster.pod("trainer", namespace="team-b")
    socket_dir = Path(tempfile.mkdtemp(prefix="podres-late-"))
    socket_path = str(socket_dir / "kubelet.sock")
    agent = cluster.agent(extra=["--podresources-socket", socket_path])
    with agent.client(DANA) as api:
        before = mount(api, "nb", devices=["0"])
        assert before.status_code == 502, before.text  # no kubelet to ask: fail closed

        with FakePodResourcesServer(socket_path) as kubelet:
            kubelet.set_allocation("team-b", "trainer", "main", "nvidia.com/gpu", [GPU0.uuid])
            refused = mount(api, "nb", devices=["0"])

    shutil.rmtree(socket_dir, ignore_errors=True)
    assert refused.status_code == 409, refused.text
    assert refused.json()["reason"] == "AllocatedToPod"
    assert f"nvidia{GPU0.minor}" not in nb.ls_dev()
