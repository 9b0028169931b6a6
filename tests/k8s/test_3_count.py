"""Flow 3: mount by count; the holder pod keeps the scheduler's books and survives the GC."""

from __future__ import annotations

import json

from tests.k8s import flows
from tests.k8s.flows import GRANTED, NVML_GPUS
from tests.k8s.node.cluster import Node

UUID_TO_INDEX = {gpu.uuid: index for index, gpu in enumerate(NVML_GPUS)}


def gc_has_caught_up(node: Node, namespace: str) -> None:
    """Wait until the garbage collector has deleted a fresh pod whose owner does not exist.

    The GC handles objects in the order it sees them: once this canary (made after
    the holder) is gone, the GC has judged the holder's owner reference too.

    The canary is never scheduled (its node selector matches no node), so the API
    server removes it the moment the GC deletes it. A canary the kubelet had started
    could take minutes to go: a 1.20 kubelet finishes starting a container before it
    honours a deletion that arrived meanwhile (the CI flake of this test).
    """
    canary = flows.new_name("gc-canary")
    manifest = flows.pod_manifest(canary, namespace, nodeSelector={"hotmount.io/no-such-node": "x"})
    manifest["metadata"]["ownerReferences"] = [
        {"apiVersion": "v1", "kind": "Pod", "name": "no-such-pod",
         "uid": "00000000-0000-4000-8000-00000000dead"},
    ]  # fmt: skip
    node.apply(manifest)
    flows.wait_for(
        "the GC deletes a pod with a dangling owner",
        lambda: flows.get_pod(node, canary, namespace) is None,
        120,
    )


def count_mode(node: Node, release: flows.Release) -> None:
    """Shared with flow 9."""
    name = flows.new_name("count-pod")
    with flows.running_pod(node, flows.pod_manifest(name)) as pod:
        reply = flows.nvcli_ok(node, "alice", "mount", "--name", pod, "--count", "1")

        holders = flows.holders_of(node, pod)
        assert len(holders) == 1, json.dumps(reply)
        holder = holders[0]
        assert holder["metadata"]["namespace"] == "default"
        (ref,) = holder["metadata"]["ownerReferences"]
        assert ref["kind"] == "Pod" and ref["name"] == pod
        assert not ref.get("controller"), ref

        gc_has_caught_up(node, "default")
        still = flows.get_pod(node, holder["metadata"]["name"])
        assert still is not None and not still["metadata"].get("deletionTimestamp")

        given = flows.pod_resources()[("default", holder["metadata"]["name"])]
        assert len(given) == 1
        assert flows.mounted_uuids(node, "alice", pod) == list(given)
        assert flows.device_state(node, pod, UUID_TO_INDEX[given[0]]) == GRANTED

        flows.nvcli_ok(node, "alice", "unmount", "--name", pod, "--all")
        flows.wait_for("the holder pod is deleted", lambda: not flows.holders_of(node, pod), 60)
        assert flows.mounted_uuids(node, "alice", pod) == []


def test_count_mode_holder_in_the_pods_namespace_survives_gc_and_matches_podresources(
    node: Node, hotmount: flows.Release
) -> None:
    count_mode(node, hotmount)
