"""Pins decided when the kubelet admits, charged for the kept GPU only (docs/api.md,
"Accounting"; issue 32), against the fake API server's scheduler and the fake kubelet,
which hands out the first free GPU: blockers in the agent's namespace hold the other
free GPUs, the tenant's one pin takes the wanted GPU, nothing waits for a pod to run,
and nothing is left behind on failure. The real-node tier (tests/k8s/test_23_pins.py)
proves the same against a real scheduler, kubelet and ResourceQuota.
"""

from __future__ import annotations

import threading
from typing import Any

from tests.agent.conftest import ALICE, Cluster
from tests.agent.test_accounting import (
    PODS,
    blockers_gone,
    given,
    gpu_pod,
    mount,
    pins_of,
    unmount,
)
from tests.fakes.dra import nvidia_slice
from tests.support.agent import GPUS
from tests.support.waiting import wait_for

GPU0, GPU1 = GPUS
AGENT_NS = "gpu-hotmount"
AGENT_PODS = f"/api/v1/namespaces/{AGENT_NS}/pods"
NEVER = 3600.0  # seconds a scheduled pod stays Pending: within a test, it never runs


def blockers(cluster: Cluster) -> list[dict[str, Any]]:
    return [
        p
        for p in cluster.kube.pods()
        if p["metadata"].get("labels", {}).get("hotmount.io/role") == "blocker"
    ]


def created_in(cluster: Cluster, path: str) -> int:
    """How many pods were created at `path` (a namespace's pods)."""
    return sum(1 for method, p in cluster.kube.requests() if method == "POST" and p == path)


def test_the_pin_holds_its_gpu_from_admission_and_the_mount_does_not_wait_for_it_to_run(
    cluster: Cluster,
) -> None:
    """Nothing the agent makes ever runs here, and the mount still succeeds: the pin
    holds GPU 1 from the moment the kubelet admitted it (PodResources), still Pending.
    Two blockers, in the agent's namespace, held both GPUs meanwhile; the tenant's
    namespace got exactly one pod, and the blockers are gone."""
    cluster.pod("nb")
    agent = cluster.agent()
    cluster.kube.running_delay = NEVER
    mounted = mount(agent, "nb", devices=["1"])
    assert mounted.status_code == 200, mounted.text
    [pin] = pins_of(cluster, "nb")
    assert pin["status"]["phase"] == "Pending", pin["status"]
    assert mounted.json()["mounted"][0]["pin"] == pin["metadata"]["name"]
    assert given(cluster, pin["metadata"]["name"]) == [GPU1.uuid]
    assert created_in(cluster, PODS) == 1
    assert created_in(cluster, AGENT_PODS) == 2
    blockers_gone(cluster)
    assert cluster.kube.free_devices("node-a") == [GPU0.uuid]
    trainer = gpu_pod(cluster, "trainer")
    assert given(cluster, "trainer") == [GPU0.uuid], trainer


def test_blockers_carry_the_non_preempting_class_and_pins_their_targets(
    cluster: Cluster,
) -> None:
    """Issue 40, item 8: a blocker counts against no quota, so it preempts no pod: it has
    the blockers' class (--blocker-priority-class, preemptionPolicy Never) and says Never
    itself; the pin keeps its target's class and the preemptionPolicy that gives."""
    cluster.pod("nb")
    agent = cluster.agent(extra=["--blocker-priority-class", "gpu-hotmount-blocker"])
    held = cluster.kube.stall(verb="delete", resource="pods")  # the blocker of GPU 1 stays
    result: dict[str, Any] = {}
    thread = threading.Thread(target=lambda: result.update(a=mount(agent, "nb", devices=["1"])))
    thread.start()
    try:
        assert held.wait_arrived(1), "the mount never freed a blocker"
        made = blockers(cluster)
        assert len(made) == 2
        for blocker in made:
            spec = blocker["spec"]
            assert (spec["priorityClassName"], spec["preemptionPolicy"]) == (
                "gpu-hotmount-blocker",
                "Never",
            ), spec
    finally:
        held.release()
        thread.join(60)
    assert result["a"].status_code == 200, result["a"].text
    [pin] = pins_of(cluster, "nb")
    assert "priorityClassName" not in pin["spec"] and "preemptionPolicy" not in pin["spec"]


def test_with_only_the_wanted_gpu_free_no_blocker_is_made(cluster: Cluster) -> None:
    cluster.pod("nb")
    agent = cluster.agent()
    gpu_pod(cluster, "trainer")  # the fake kubelet gives it GPU 0
    assert given(cluster, "trainer") == [GPU0.uuid]
    assert mount(agent, "nb", devices=["1"]).status_code == 200
    assert created_in(cluster, AGENT_PODS) == 0
    [pin] = pins_of(cluster, "nb")
    assert given(cluster, pin["metadata"]["name"]) == [GPU1.uuid]


def test_a_quota_of_one_gpu_pins_either_free_gpu_five_times_out_of_five(cluster: Cluster) -> None:
    """Both GPUs free and room in the quota for one: the blockers are not the tenant's to
    pay for, so the pin of either GPU succeeds every time (scouts in the tenant's
    namespace got the wanted GPU only when the kubelet happened to give it first)."""
    cluster.kube.set_gpu_quota("default", "one-gpu", 1)
    cluster.pod("nb")
    agent = cluster.agent()
    for attempt, device in enumerate(["1", "0", "1", "0", "1"]):
        mounted = mount(agent, "nb", devices=[device])
        assert mounted.status_code == 200, (attempt, mounted.text)
        [pin] = pins_of(cluster, "nb")
        assert given(cluster, pin["metadata"]["name"]) == [GPUS[int(device)].uuid], attempt
        assert unmount(agent, "nb", device).status_code == 200
        assert pins_of(cluster, "nb") == [] and blockers(cluster) == [], attempt


def test_no_room_in_the_quota_refuses_the_mount_and_leaves_nothing(cluster: Cluster) -> None:
    """The pin is refused after the blockers held both GPUs: every blocker goes, no pin is
    left, both GPUs are free, and the answer names the quota."""
    cluster.kube.set_gpu_quota("default", "no-gpus", 0)
    container = cluster.pod("nb")
    agent = cluster.agent()
    refused = mount(agent, "nb", devices=["1"])
    assert refused.status_code == 403, refused.text
    assert refused.json()["reason"] == "QuotaExceeded"
    assert "no-gpus" in refused.json()["message"]
    assert created_in(cluster, AGENT_PODS) == 2, "the blockers were made"
    assert blockers(cluster) == [] and pins_of(cluster, "nb") == []
    assert sorted(cluster.kube.free_devices("node-a")) == sorted(g.uuid for g in GPUS)
    assert f"nvidia{GPU1.minor}" not in container.ls_dev()


def test_two_mounts_by_name_at_once_both_succeed(cluster: Cluster) -> None:
    """Mount A is held at the moment its blockers hold both GPUs. Mount B, of the other
    GPU, looks at the kubelet's books then: a blocker holding its GPU is no owner (it is
    not refused as given to another pod); it waits for the node's turn, and both pin."""
    cluster.pod("a")
    cluster.pod("b")
    agent = cluster.agent()
    held = cluster.kube.stall(verb="delete", resource="pods")  # A freeing its GPU's blocker
    results: dict[str, Any] = {}
    threads = [
        threading.Thread(target=lambda: results.update(a=mount(agent, "a", devices=["1"]))),
        threading.Thread(target=lambda: results.update(b=mount(agent, "b", devices=["0"]))),
    ]
    threads[0].start()
    try:
        assert held.wait_arrived(1), "mount A never freed a blocker"
        assert len(blockers(cluster)) == 2
        threads[1].start()

        def b_looked_at_a_blocker() -> bool:
            return any(
                method == "GET" and path.startswith(f"{AGENT_PODS}/hotmount-blocker-")
                for method, path in cluster.kube.requests()
            )

        wait_for(b_looked_at_a_blocker, "mount B reads the kubelet's books")
    finally:
        held.release()
        for thread in threads:
            thread.join(60)
    assert results["a"].status_code == 200, results["a"].text
    assert results["b"].status_code == 200, results["b"].text
    [pin_a], [pin_b] = pins_of(cluster, "a"), pins_of(cluster, "b")
    assert given(cluster, pin_a["metadata"]["name"]) == [GPU1.uuid]
    assert given(cluster, pin_b["metadata"]["name"]) == [GPU0.uuid]
    assert blockers(cluster) == []


def test_a_blocker_left_by_an_agent_killed_mid_pin_is_collected(cluster: Cluster) -> None:
    """A blocker no mount accounts for (its agent died before deleting it) holds a GPU the
    scheduler would otherwise hand out: reconcile deletes it like any orphan holder."""
    cluster.agent(extra=["--holder-orphan-grace", "0"])
    agent_pod = cluster.kube.pod(AGENT_NS, "gpu-hotmount-node-a")
    assert agent_pod is not None
    manifest = {
        "metadata": {
            "name": "hotmount-blocker-0a1b2c3d",
            "labels": {
                "app.kubernetes.io/managed-by": "gpu-hotmount",
                "hotmount.io/holder-for": agent_pod["metadata"]["name"],
                "hotmount.io/role": "blocker",
            },
        },
        "spec": {
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {
                                "matchFields": [
                                    {"key": "metadata.name", "operator": "In", "values": ["node-a"]}
                                ]
                            }
                        ]
                    }
                }
            },
            "containers": [
                {
                    "name": "holder",
                    "image": "pause",
                    "resources": {"limits": {"nvidia.com/gpu": "1"}},
                }
            ],
        },
    }
    with cluster.api(cluster.kube.admin_token) as api:
        assert api.post(AGENT_PODS, json=manifest).status_code == 201
    assert len(cluster.kube.free_devices("node-a")) == 1
    wait_for(lambda: blockers(cluster) == [], "the orphan blocker is deleted", timeout=30)
    assert len(cluster.kube.free_devices("node-a")) == 2


def test_a_dra_pin_holds_its_gpu_once_its_claim_is_allocated_not_once_it_runs(
    cluster: Cluster,
) -> None:
    devices = {f"gpu-{gpu.minor}": ("gpu", gpu.uuid) for gpu in GPUS}
    cluster.kube.put_resource_slice(nvidia_slice("node-a", devices))
    cluster.pod("nb")
    agent = cluster.agent()
    cluster.kube.running_delay = NEVER
    mounted = mount(agent, "nb", devices=["1"])
    assert mounted.status_code == 200, mounted.text
    [pin] = pins_of(cluster, "nb")
    assert pin["status"]["phase"] == "Pending" and pin["spec"]["nodeName"] == "node-a"
    claim = cluster.kube.resource_claim("default", pin["metadata"]["name"])
    assert claim is not None
    assert [r["uid"] for r in claim["status"]["reservedFor"]] == [pin["metadata"]["uid"]]
    assert blockers(cluster) == []  # a claim names its GPU: no blockers under DRA
    with agent.client(ALICE) as api:
        status = api.get("/v1/namespaces/default/pods/nb/devices").json()
    assert status["containers"][0]["devices"][0]["pin"] == pin["metadata"]["name"]
