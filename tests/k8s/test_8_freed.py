"""Flow 8: deleting a pod that holds a GPU frees it for another pod within one reconcile."""

from __future__ import annotations

import time

from tests.k8s import flows
from tests.k8s.flows import EXIT_CONFLICT, GRANTED, NVML_GPUS, RECONCILE_INTERVAL
from tests.k8s.node.cluster import Node


def test_a_deleted_pods_gpu_is_free_for_another_pod_within_one_reconcile(
    node: Node, hotmount: flows.Release
) -> None:
    holder, waiting = flows.new_name("holder"), flows.new_name("waiting")
    with flows.running_pod(node, flows.pod_manifest(waiting)):
        with flows.running_pod(node, flows.pod_manifest(holder)):
            flows.nvcli_ok(node, "alice", "mount", "--name", holder, "--mount", "0")
            taken = flows.nvcli(node, "alice", "mount", "--name", waiting, "--mount", "0")
            assert taken.returncode == EXIT_CONFLICT, taken.stderr
        gone = time.monotonic()  # running_pod waited until the pod was deleted

        def mounted() -> bool:
            attempt = flows.nvcli(node, "alice", "mount", "--name", waiting, "--mount", "0")
            assert attempt.returncode in (0, EXIT_CONFLICT), attempt.stderr
            return attempt.returncode == 0

        # One reconcile interval, plus what one nvcli call and the deletion's own
        # propagation take: the bound is the interval, not "eventually".
        flows.wait_for("GPU 0 is free again", mounted, RECONCILE_INTERVAL + 10, every=0.5)
        freed_after = time.monotonic() - gone
        assert freed_after <= RECONCILE_INTERVAL + 10
        assert flows.mounted_uuids(node, "alice", waiting) == [NVML_GPUS[0].uuid]
        assert flows.device_state(node, waiting) == GRANTED
        flows.nvcli_ok(node, "alice", "unmount", "--name", waiting, "--all")
