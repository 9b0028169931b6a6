"""Flow 9: the hardened DaemonSet (`hardened=true`: no `privileged`, a capability list)
passes flows 1, 3 and 7 on a real node. Last in the tier: it upgrades the release."""

from __future__ import annotations

import json

import pytest

from tests.k8s import flows
from tests.k8s.node.cluster import Node
from tests.k8s.test_1_mount import mount_and_unmount
from tests.k8s.test_3_count import count_mode
from tests.k8s.test_7_restart import restart_under_load


@pytest.fixture(scope="module")
def hardened(node: Node, hotmount: flows.Release) -> flows.Release:
    hotmount.set_hardened(True)
    pod = hotmount.agent_pod()
    spec = json.loads(
        node.kubectl("get", "pod", str(pod), "-n", flows.NAMESPACE, "-o", "json").stdout
    )["spec"]["containers"][0]["securityContext"]
    assert not spec.get("privileged"), spec
    assert spec["capabilities"]["drop"] == ["ALL"], spec
    return hotmount


def test_hardened_flow_1_mount_and_unmount(node: Node, hardened: flows.Release) -> None:
    mount_and_unmount(node, hardened)


def test_hardened_flow_3_count_mode(node: Node, hardened: flows.Release) -> None:
    count_mode(node, hardened)


def test_hardened_flow_7_restart_under_load(node: Node, hardened: flows.Release) -> None:
    restart_under_load(node, hardened)
