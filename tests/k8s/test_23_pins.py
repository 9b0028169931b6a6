"""Flow 23: pins made when the kubelet admits, paid for by the kept GPU only (issue 32).

On the real node with the device plugin's two GPUs: a namespace whose quota has room for
one GPU pins either of them every time (blockers in the agent's namespace hold the
other); an ordinary GPU pod created while a pin is made may wait Pending but is never
refused admission; two mounts by name on the node at the same moment both succeed.
"""

from __future__ import annotations

import functools
import json
import threading
from typing import Any

from tests.k8s import flows
from tests.k8s.flows import NAMESPACE, NVML_GPUS
from tests.k8s.node.cluster import Node

GPUS = [gpu.uuid for gpu in NVML_GPUS]
BLOCKERS = "app.kubernetes.io/managed-by=gpu-hotmount,hotmount.io/role=blocker"


def blockers(node: Node) -> list[str]:
    found = node.kubectl("get", "pods", "-n", NAMESPACE, "-l", BLOCKERS, "-o", "json").stdout
    return [p["metadata"]["name"] for p in json.loads(found)["items"]]


def blockers_go(node: Node) -> None:
    """The blockers are deleted once the pin holds its GPU, beside the rest of the mount
    (agent/books/turns.py): gone within moments of the answer."""
    flows.wait_for("no blocker outlives the mount", lambda: blockers(node) == [], 30, every=0.1)


def pinned_to(node: Node, pod: str, namespace: str = "default") -> tuple[str, ...]:
    """What the kubelet gave the pod's one live pin (PodResources)."""
    pin = flows.the_pin(node, pod, namespace)["metadata"]["name"]
    return flows.pod_resources().get((namespace, pin), ())


def test_a_quota_of_one_gpu_pins_either_free_gpu_five_times_out_of_five(
    node: Node, hotmount: flows.Release
) -> None:
    with flows.namespace_with_gpu_quota(node, 1) as (namespace, _quota):
        name = flows.new_name("tenant")
        with flows.running_pod(node, flows.quick_pod_manifest(name, namespace)) as pod:
            outcomes = []
            for index in (1, 0, 1, 0, 1):
                mounted = flows.nvcli(
                    node, "alice", "mount", "--name", pod, "-n", namespace, "--mount", str(index)
                )
                outcomes.append(mounted.returncode)
                assert mounted.returncode == 0, (outcomes, mounted.stderr)
                assert pinned_to(node, pod, namespace) == (GPUS[index],), outcomes
                assert flows.mounted_uuids(node, "alice", pod, namespace) == [GPUS[index]]
                blockers_go(node)
                flows.nvcli_ok(node, "alice", "unmount", "--name", pod, "-n", namespace, "--all")
                assert flows.pins(node, pod, namespace) == []
            assert outcomes == [0] * 5


def test_an_ordinary_gpu_pod_created_while_a_pin_is_made_is_never_refused_admission(
    node: Node, hotmount: flows.Release
) -> None:
    """Three rounds: an ordinary 1-GPU pod is created the moment a mount of GPU 1 by name
    starts, more while it runs. Each is admitted (it may wait Pending while the blockers
    hold both GPUs); none fails with UnexpectedAdmissionError or any other rejection.
    The mount succeeds, or, where an ordinary pod was given GPU 1 first, is refused as
    for any GPU the kubelet gave away; never do both have it."""
    name = flows.new_name("pinned")
    with flows.running_pod(node, flows.quick_pod_manifest(name)) as pod:
        for round_ in range(3):
            ordinary: list[str] = []
            result: list[Any] = []
            mounter = threading.Thread(target=_mount_gpu1, args=(node, pod, result))
            try:
                ordinary.append(flows.new_name("ordinary"))
                node.apply(flows.gpu_pod_manifest(ordinary[-1], 1))
                mounter.start()
                while mounter.is_alive() and len(ordinary) < 4:
                    ordinary.append(flows.new_name("ordinary"))
                    node.apply(flows.gpu_pod_manifest(ordinary[-1], 1))
                mounter.join(180)
                [mounted] = result
                given = {o: _admitted(node, o) for o in ordinary}
                if mounted.returncode == 0:
                    assert pinned_to(node, pod) == (GPUS[1],)
                    assert all(g != (GPUS[1],) for g in given.values() if g), given
                else:
                    assert mounted.returncode == flows.EXIT_CONFLICT, mounted.stderr
                    assert (GPUS[1],) in given.values(), (given, mounted.stderr)
                    assert flows.pins(node, pod) == []
                blockers_go(node)
                for other in ordinary:  # none was rejected after it was looked at either
                    status = (flows.get_pod(node, other) or {}).get("status", {})
                    assert status.get("phase") != "Failed", (other, status)
            finally:
                mounter.join(180)
                for other in ordinary:
                    flows.delete_pod(node, other)
                flows.nvcli(node, "alice", "unmount", "--name", pod, "--all")
            assert flows.pins(node, pod) == [], round_


def test_a_gpu_pod_created_the_moment_the_mount_answers_never_gets_the_pinned_gpu(
    node: Node, hotmount: flows.Release
) -> None:
    """The mount answers while its blockers are still being deleted. Ordinary GPU pods
    created at that moment (three rounds, two pods each, for two GPUs) wait Pending for
    the blocker to go or get the other GPU; the pinned GPU stays the pin's and the
    tenant's, and no pod is refused admission."""
    name = flows.new_name("pinned")
    with flows.running_pod(node, flows.quick_pod_manifest(name)) as pod:
        for round_, index in enumerate((0, 1, 0)):
            ordinary = [flows.new_name("ordinary"), flows.new_name("ordinary")]
            try:
                flows.nvcli_ok(node, "alice", "mount", "--name", pod, "--mount", str(index))
                for other in ordinary:
                    node.apply(flows.gpu_pod_manifest(other, 1))
                blockers_go(node)
                flows.wait_for(
                    "an ordinary pod runs on the GPU the blocker held",
                    functools.partial(_any_runs, node, ordinary),
                    120,
                )
                given = {o: _admitted(node, o) for o in ordinary}
                assert sorted(given.values()) == [(), (GPUS[1 - index],)], (round_, given)
                assert pinned_to(node, pod) == (GPUS[index],), round_
                assert flows.mounted_uuids(node, "alice", pod) == [GPUS[index]], round_
            finally:
                for other in ordinary:
                    flows.delete_pod(node, other)
                flows.nvcli(node, "alice", "unmount", "--name", pod, "--all")
            assert flows.pins(node, pod) == [], round_


def _any_runs(node: Node, pods: list[str]) -> bool:
    return any(flows.phase(node, pod) == "Running" for pod in pods)


def _admitted(node: Node, name: str) -> tuple[str, ...]:
    """Wait until the ordinary pod runs (or is rejected, which fails the flow); the GPUs
    the kubelet gave it, () while it still waits Pending for one (both are held)."""

    def settled() -> dict[str, Any] | None:
        pod = flows.get_pod(node, name)
        assert pod is not None, f"{name} disappeared"
        status = pod.get("status", {})
        assert status.get("phase") != "Failed", f"{name} was refused admission: {status}"
        if status.get("phase") == "Running":
            return pod
        return pod if flows.scheduled(node, name) == ("False", "Unschedulable") else None

    pod = flows.wait_for(f"{name} is admitted or waits for a GPU", settled, 120)
    if pod["status"].get("phase") != "Running":
        return ()
    return tuple(sorted(flows.pod_resources().get(("default", name), ())))


def test_two_mounts_by_name_at_once_on_the_node_both_succeed(
    node: Node, hotmount: flows.Release
) -> None:
    a, b = flows.new_name("first"), flows.new_name("second")
    with (
        flows.running_pod(node, flows.quick_pod_manifest(a)),
        flows.running_pod(node, flows.quick_pod_manifest(b)),
    ):
        for round_, (gpu_a, gpu_b) in enumerate([(0, 1), (1, 0), (0, 1)]):
            results: dict[str, Any] = {}
            start = threading.Barrier(2)
            threads = [
                threading.Thread(target=_mount_at, args=(node, pod, index, start, results))
                for pod, index in ((a, gpu_a), (b, gpu_b))
            ]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(180)
            try:
                for pod in (a, b):
                    assert results[pod].returncode == 0, (round_, pod, results[pod].stderr)
                assert pinned_to(node, a) == (GPUS[gpu_a],), round_
                assert pinned_to(node, b) == (GPUS[gpu_b],), round_
                blockers_go(node)
            finally:
                for pod in (a, b):
                    flows.nvcli(node, "alice", "unmount", "--name", pod, "--all")
            assert flows.pins(node, a) == [] and flows.pins(node, b) == []


def _mount_at(
    node: Node, pod: str, index: int, start: threading.Barrier, results: dict[str, Any]
) -> None:
    """`nvcli mount --mount index` the moment the other thread is ready too."""
    start.wait(30)
    results[pod] = flows.nvcli(node, "alice", "mount", "--name", pod, "--mount", str(index))


def _mount_gpu1(node: Node, pod: str, result: list[Any]) -> None:
    result.append(flows.nvcli(node, "alice", "mount", "--name", pod, "--mount", "1"))
