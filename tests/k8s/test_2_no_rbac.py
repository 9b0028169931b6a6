"""Flow 2: a user without RBAC gets exit 5 for mount, unmount and move, and nothing changes."""

from __future__ import annotations

from tests.k8s import flows
from tests.k8s.flows import ABSENT, EXIT_AUTH, GRANTED, NVML_GPUS
from tests.k8s.node.cluster import Node


def test_a_user_without_rbac_is_refused_with_exit_5_and_nothing_changes(
    node: Node, hotmount: flows.Release
) -> None:
    a, b = flows.new_name("a"), flows.new_name("b")
    with (
        flows.running_pod(node, flows.pod_manifest(a)),
        flows.running_pod(node, flows.pod_manifest(b)),
    ):
        flows.nvcli_ok(node, "alice", "mount", "--name", a, "--mount", "0")

        attempts = {
            "mount": ("mount", "--name", b, "--mount", "1"),
            "unmount": ("unmount", "--name", a, "--unmount", "0"),
            "move": ("move", "--gpu", "0", "--from", a, "--to", b),
        }
        for verb, args in attempts.items():
            refused = flows.nvcli(node, "bob", *args)
            assert refused.returncode == EXIT_AUTH, (verb, refused.returncode, refused.stderr)
            assert "forbidden" in refused.stderr.lower(), (verb, refused.stderr)

        assert flows.mounted_uuids(node, "alice", a) == [NVML_GPUS[0].uuid]
        assert flows.mounted_uuids(node, "alice", b) == []
        assert flows.device_state(node, a) == GRANTED
        assert flows.device_state(node, b, 1) == ABSENT
        assert flows.device_state(node, b, 0) == ABSENT
        flows.nvcli_ok(node, "alice", "unmount", "--name", a, "--all")
