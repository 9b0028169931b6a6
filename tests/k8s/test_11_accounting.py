"""Flow 11: a GPU hot-mounted by name is in the scheduler's books (docs/api.md, "Accounting").

What a tenant sees on the real node with the device plugin: the kubelet never hands
a hot-mounted GPU to an ordinary GPU pod (without the pin it gave GPU 0 four times
out of four while GPU 0 was hot-mounted and GPU 1 free), count mode finds the free
GPU every time, the namespace's ResourceQuota pays for the pin, a move hands the pin
over without a gap, and the pin is as hard to preempt as its pod.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from tests.k8s import flows
from tests.k8s.flows import ABSENT, EXIT_QUOTA, GRANTED, NVML_GPUS
from tests.k8s.node.cluster import NODE_NAME, Node

GPU0, GPU1 = NVML_GPUS[0].uuid, NVML_GPUS[1].uuid


def mount_gpu0(node: Node, pod: str, namespace: str = "default") -> dict[str, Any]:
    """`nvcli mount --mount 0` as alice; the pin it made (checked against the reply)."""
    reply = flows.nvcli_ok(node, "alice", "mount", "--name", pod, "-n", namespace, "--mount", "0")
    pin = flows.the_pin(node, pod, namespace)
    assert [m.get("pin") for m in reply["mounted"]] == [pin["metadata"]["name"]], reply
    return pin


@contextmanager
def pod_with_gpu0(node: Node, namespace: str = "default", **spec: Any) -> Iterator[str]:
    """A running pod with GPU 0 hot-mounted by name; unmounted and deleted afterwards."""
    name = flows.new_name("pinned")
    with flows.running_pod(node, flows.quick_pod_manifest(name, namespace, **spec)) as pod:
        mount_gpu0(node, pod, namespace)
        try:
            yield pod
        finally:
            flows.nvcli(node, "alice", "unmount", "--name", pod, "-n", namespace, "--all")


def test_ordinary_gpu_pods_never_get_a_hot_mounted_gpu_and_get_it_right_after_unmount(
    node: Node, hotmount: flows.Release
) -> None:
    name = flows.new_name("pinned")
    with flows.running_pod(node, flows.quick_pod_manifest(name)) as pod:
        pin = mount_gpu0(node, pod)
        pin_name = pin["metadata"]["name"]

        # The pin: the kubelet gave it exactly GPU 0; Guaranteed, held to this node.
        assert pin_name.startswith(f"hotmount-pin-{pod}-"), pin_name
        labels = pin["metadata"]["labels"]
        assert labels["hotmount.io/holder-for"] == pod and labels["hotmount.io/role"] == "pin"
        assert flows.pod_resources()[("default", pin_name)] == (GPU0,)
        assert pin["status"]["qosClass"] == "Guaranteed", pin["status"]
        terms = pin["spec"]["affinity"]["nodeAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"
        ]["nodeSelectorTerms"]
        assert terms == [
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [NODE_NAME]}]}
        ], terms
        assert flows.status_pins(node, "alice", pod) == {GPU0: pin_name}
        listed = flows.nvcli(node, "admin", "list")
        assert listed.returncode == 0, listed.stderr
        assert "BOOKS" in listed.stdout and "device-plugin" in listed.stdout, listed.stdout
        assert f"default/{pod} (main) [hotmount, pin {pin_name}]" in listed.stdout, listed.stdout

        # Ordinary 1-GPU pods one after another: each gets GPU 1, never GPU 0.
        given = [flows.ordinary_gpu_pod(node) for _ in range(4)]
        assert given == [(GPU1,)] * 4, given
        assert flows.mounted_uuids(node, "alice", pod) == [GPU0]
        assert flows.device_state(node, pod) == GRANTED

        # A 2-GPU pod does not fit while GPU 0 is hot-mounted...
        wide = flows.new_name("wide")
        node.apply(flows.gpu_pod_manifest(wide, 2))
        try:
            flows.wait_unschedulable(node, wide)
            assert ("default", wide) not in flows.pod_resources()

            # ...and is scheduled once it is unmounted: unmount returns with the pin gone.
            flows.nvcli_ok(node, "alice", "unmount", "--name", pod, "--unmount", "0")
            assert flows.pins(node, pod) == [], "the pin outlived the unmount"
            unmounted = time.monotonic()
            assert flows.given_to(node, wide) == (GPU0, GPU1)
            took = time.monotonic() - unmounted
            # The scheduler's own backoff for an unschedulable pod is at most 10 s.
            assert took < 30, f"the 2-GPU pod waited {took:.0f}s after the unmount"
        finally:
            flows.delete_pod(node, wide)
        assert flows.mounted_uuids(node, "alice", pod) == []


def test_count_mode_finds_the_free_gpu_three_times_out_of_three_beside_a_pin(
    node: Node, hotmount: flows.Release
) -> None:
    counted = flows.new_name("counted")
    with pod_with_gpu0(node) as pinned, flows.running_pod(node, flows.quick_pod_manifest(counted)):
        for attempt in range(3):
            reply = flows.nvcli_ok(node, "alice", "mount", "--name", counted, "--count", "1")
            holders = flows.holders_of(node, counted)
            assert len(holders) == 1, (attempt, json.dumps(reply))
            holder = holders[0]["metadata"]["name"]
            assert flows.pod_resources()[("default", holder)] == (GPU1,), attempt
            assert flows.mounted_uuids(node, "alice", counted) == [GPU1], attempt
            flows.nvcli_ok(node, "alice", "unmount", "--name", counted, "--all")
            flows.wait_for("the holder is gone", lambda: not flows.holders_of(node, counted), 60)
        assert flows.mounted_uuids(node, "alice", pinned) == [GPU0]


def test_a_namespace_quota_without_gpus_refuses_the_mount_with_exit_7_and_leaves_nothing(
    node: Node, hotmount: flows.Release
) -> None:
    with flows.namespace_with_gpu_quota(node, 0) as (namespace, quota):
        name = flows.new_name("tenant")
        with flows.running_pod(node, flows.quick_pod_manifest(name, namespace)) as pod:
            refused = flows.nvcli(
                node, "alice", "mount", "--name", pod, "-n", namespace, "--mount", "0"
            )
            assert refused.returncode == EXIT_QUOTA, (refused.returncode, refused.stderr)
            assert quota in refused.stderr, refused.stderr
            assert flows.mounted_uuids(node, "alice", pod, namespace) == []
            assert flows.device_state(node, pod, namespace=namespace) == ABSENT
            assert flows.pins(node, namespace=namespace) == []
            assert flows.holders_of(node, pod, namespace) == []


def test_a_move_hands_the_pin_over_and_no_ordinary_pod_gets_the_gpu_meanwhile(
    node: Node, hotmount: flows.Release
) -> None:
    a, b = flows.new_name("from"), flows.new_name("to")
    with (
        flows.running_pod(node, flows.quick_pod_manifest(a)),
        flows.running_pod(node, flows.quick_pod_manifest(b)),
    ):
        before = mount_gpu0(node, a)
        moved: list[Any] = []
        mover = threading.Thread(
            target=lambda: moved.append(
                flows.nvcli(node, "alice", "move", "--gpu", "0", "--from", a, "--to", b)
            )
        )
        given: list[tuple[str, tuple[str, ...]]] = []
        try:
            # The first ordinary pod is asked for just before the move starts; more while
            # it runs, and two after it.
            first = flows.new_name("ordinary")
            node.apply(flows.gpu_pod_manifest(first, 1))
            mover.start()
            try:
                given.append(("during", flows.given_to(node, first)))
            finally:
                flows.delete_pod(node, first)
            while mover.is_alive():
                given.append(("during", flows.ordinary_gpu_pod(node)))
            mover.join()
            given += [("after", flows.ordinary_gpu_pod(node)) for _ in range(2)]
        finally:
            mover.join(timeout=200)
        assert moved and moved[0].returncode == 0, moved and moved[0].stderr
        assert all(uuids == (GPU1,) for _, uuids in given), given

        after = flows.the_pin(node, b)
        assert after["metadata"]["name"] == before["metadata"]["name"]
        assert after["metadata"]["uid"] == before["metadata"]["uid"], "a new pin, not handed over"
        assert after["metadata"]["labels"]["hotmount.io/holder-for"] == b
        b_uid = flows.get_pod(node, b)["metadata"]["uid"]  # type: ignore[index]
        assert [r["uid"] for r in after["metadata"]["ownerReferences"]] == [b_uid]
        assert flows.pins(node, a) == []
        assert flows.mounted_uuids(node, "alice", b) == [GPU0]
        assert flows.status_pins(node, "alice", b) == {GPU0: after["metadata"]["name"]}
        assert flows.device_state(node, b) == GRANTED
        flows.nvcli_ok(node, "alice", "unmount", "--name", b, "--all")
        assert flows.pins(node, b) == []


def test_the_pin_has_its_pods_priority_and_an_equal_priority_gpu_pod_cannot_preempt_it(
    node: Node, hotmount: flows.Release
) -> None:
    priority = flows.HIGH_PRIORITY  # listed in the release's holder.priorityClasses
    node.apply(
        {
            "apiVersion": "scheduling.k8s.io/v1",
            "kind": "PriorityClass",
            "metadata": {"name": priority},
            "value": 1000,
        }
    )
    try:
        with pod_with_gpu0(node, priorityClassName=priority) as pod:
            pin = flows.the_pin(node, pod)
            assert pin["spec"].get("priorityClassName") == priority, pin["spec"]
            assert pin["spec"].get("priority") == 1000, pin["spec"]
            # Running before the rival comes: the phase asserted below is then the pin's
            # survival, not how fast a loaded node starts a container.
            flows.wait_for(
                "the pin runs",
                lambda: flows.phase(node, pin["metadata"]["name"]) == "Running",
            )

            rival = flows.new_name("rival")
            node.apply(flows.gpu_pod_manifest(rival, 2, priorityClassName=priority))
            try:
                flows.wait_unschedulable(node, rival)
                # Preemption is decided in the scheduling cycle that found no room, and the
                # scheduler says what it decided in its FailedScheduling event.
                flows.wait_for(
                    "the scheduler to report that it found no pod to preempt",
                    lambda: [
                        e["message"]
                        for e in flows.events(node, rival, "FailedScheduling")
                        if "preemption:" in e.get("message", "")
                    ],
                )
                now = flows.get_pod(node, pin["metadata"]["name"])
                assert now is not None, "the pin was preempted"
                assert now["metadata"]["uid"] == pin["metadata"]["uid"]
                assert not now["metadata"].get("deletionTimestamp"), "the pin is being deleted"
                assert now["status"]["phase"] == "Running", now["status"]
                assert flows.scheduled(node, rival) == ("False", "Unschedulable")
                rival_status = flows.get_pod(node, rival)["status"]  # type: ignore[index]
                assert not rival_status.get("nominatedNodeName"), rival_status
                assert flows.mounted_uuids(node, "alice", pod) == [GPU0]
                assert flows.device_state(node, pod) == GRANTED
            finally:
                flows.delete_pod(node, rival)
    finally:
        node.kubectl("delete", "priorityclass", priority, "--ignore-not-found", check=False)
