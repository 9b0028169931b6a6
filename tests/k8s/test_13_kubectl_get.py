"""`kubectl get gpumounts` and `nodedevices` as an operator sees them on the real node.

The real API server proxies kubectl's Table request to the agent, and its own
authorizer decides `-A` (cluster scope) before the agent is asked.
"""

from __future__ import annotations

import re

from tests.k8s import flows
from tests.k8s.flows import NVML_GPUS
from tests.k8s.node.cluster import NODE_NAME, Node


def test_kubectl_get_prints_the_mounts_and_the_nodes_devices(
    node: Node, hotmount: flows.Release
) -> None:
    name = flows.new_name("table-pod")
    with flows.running_pod(node, flows.pod_manifest(name)) as pod:
        flows.nvcli_ok(node, "alice", "mount", "--name", pod, "--mount", "1")

        (row,) = [r for r in flows.kubectl_table(node, "alice", "gpumounts") if r["NAME"] == pod]
        assert list(row) == [
            "NAME", "CONTAINER", "GPUS", "IDLE", "SHARED", "PIN OR HOLDER", "QUEUE", "AGE"
        ]  # fmt: skip
        assert row["CONTAINER"] == "main"
        assert row["GPUS"] == f"1 ({NVML_GPUS[1].uuid.removeprefix('GPU-')[:8]})"
        assert row["PIN OR HOLDER"].startswith("pin hotmount-pin-")
        assert re.fullmatch(r"\d+[sm].*", row["AGE"]), row

        (wide,) = [
            r
            for r in flows.kubectl_table(node, "alice", "gpumounts", "-o", "wide")
            if r["NAME"] == pod
        ]
        assert (wide["NODE"], wide["UUIDS"]) == (NODE_NAME, NVML_GPUS[1].uuid)

        # -A: the admin may list at the cluster scope; alice's RoleBinding does not reach it
        everywhere = flows.kubectl_table(node, "admin", "gpumounts", "-A")
        assert ("default", pod) in {(r["NAMESPACE"], r["NAME"]) for r in everywhere}
        refused = node.kubectl("get", "gpumounts", "-A", user="alice", check=False)
        assert refused.returncode != 0 and "forbidden" in refused.stderr.lower(), refused.stderr

        devices = {r["GPU"]: r for r in flows.kubectl_table(node, "admin", "nodedevices")}
        assert list(devices["1"]) == ["NODE", "GPU", "UUID", "HELD BY", "MANAGED", "AGE"]
        assert devices["1"]["UUID"] == NVML_GPUS[1].uuid
        assert devices["1"]["HELD BY"].startswith(f"default/{pod} (main) [hotmount, pin ")
        assert devices["1"]["MANAGED"] == "device plugin"

        flows.nvcli_ok(node, "alice", "unmount", "--name", pod, "--all")
        assert not [r for r in flows.kubectl_table(node, "alice", "gpumounts") if r["NAME"] == pod]
