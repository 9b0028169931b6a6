"""Every hot-mount in the scheduler's books (docs/api.md, "Accounting"), against the fake
API server's scheduler and the fake kubelet: pins for a device plugin's GPUs and for
DRA's, none for GPUs nobody else manages, and double booking found by reconcile.

The real-node tier (tests/k8s) proves the device-plugin case on a real kubelet; DRA has
no real cluster here (Kubernetes 1.34+), so its wire formats are the fakes' (tests/fakes/
dra.py follows NVIDIA's driver and the v1 API).
"""

from __future__ import annotations

from typing import Any

from tests.agent.conftest import ALICE, Cluster
from tests.agent.test_holder_leaks import after_two_reconciles, metric_sum
from tests.fakes.dra import nvidia_slice
from tests.support.agent import GPUS, AgentProcess
from tests.support.waiting import wait_for

GPU0, GPU1 = GPUS
PODS = "/api/v1/namespaces/default/pods"


def mount(agent: AgentProcess, pod: str, **body: Any) -> Any:
    with agent.client(ALICE) as api:
        return api.post(f"/v1/namespaces/default/pods/{pod}/devices", json=body)


def unmount(agent: AgentProcess, pod: str, device: str = "0") -> Any:
    with agent.client(ALICE) as api:
        return api.delete(f"/v1/namespaces/default/pods/{pod}/devices/{device}")


def gpu_pod(cluster: Cluster, name: str, gpus: int = 1, **spec: Any) -> dict[str, Any]:
    """An ordinary pod asking the scheduler for `gpus` GPUs, as any tenant would."""
    manifest = {
        "metadata": {"name": name},
        "spec": {
            "containers": [
                {
                    "name": "main",
                    "image": "cuda",
                    "resources": {"limits": {"nvidia.com/gpu": str(gpus)}},
                }
            ],
            **spec,
        },
    }
    with cluster.api(cluster.kube.admin_token) as api:
        created = api.post(PODS, json=manifest)
    assert created.status_code == 201, created.text
    return created.json()


def given(cluster: Cluster, pod: str) -> list[str]:
    """The GPU UUIDs the (fake) kubelet gave `pod`."""
    containers = cluster.kubelets["node-a"].allocations().get(("default", pod), {})
    return sorted(d for res in containers.values() for ids in res.values() for d in ids)


def pins_of(cluster: Cluster, pod: str) -> list[dict[str, Any]]:
    return [
        p
        for p in cluster.kube.pods()
        if p["metadata"].get("labels", {}).get("hotmount.io/holder-for") == pod
        and p["metadata"]["labels"].get("hotmount.io/role") == "pin"
    ]


def blockers_gone(cluster: Cluster) -> None:
    """The blockers of a pin are deleted beside the mount's answer, a moment after it
    (agent/books/turns.py): gone within moments."""

    def none_left() -> bool:
        return not any(
            p["metadata"].get("labels", {}).get("hotmount.io/role") == "blocker"
            for p in cluster.kube.pods()
        )

    wait_for(none_left, "the blockers are deleted once the pin holds its GPU")


def test_a_named_gpu_is_pinned_so_ordinary_pods_get_the_free_one(cluster: Cluster) -> None:
    """GPU 1 mounted by name: the fake kubelet hands out the first free GPU, so a single
    1-GPU holder would get GPU 0. The pin holds both, keeps the one given GPU 1, and
    frees GPU 0, which every ordinary pod then gets, while GPU 1 is never handed out."""
    cluster.pod("nb")
    agent = cluster.agent()
    mounted = mount(agent, "nb", devices=["1"])
    assert mounted.status_code == 200, mounted.text
    [device] = mounted.json()["mounted"]
    [pin] = pins_of(cluster, "nb")
    assert device["pin"] == pin["metadata"]["name"]
    assert given(cluster, pin["metadata"]["name"]) == [GPU1.uuid]
    blockers_gone(cluster)  # the blocker of GPU 0 goes beside the mount's answer
    assert cluster.kube.free_devices("node-a") == [GPU0.uuid]

    first = gpu_pod(cluster, "trainer-1")
    assert given(cluster, "trainer-1") == [GPU0.uuid], first
    second = gpu_pod(cluster, "trainer-2")  # no GPU left: it waits, GPU 1 is not given
    assert second["status"]["phase"] == "Pending" and given(cluster, "trainer-2") == []

    # The pin shows wherever the mount does.
    with agent.client(ALICE) as api:
        status = api.get("/v1/namespaces/default/pods/nb/devices").json()
        listed = {d["key"]: d for d in api.get("/v1/devices").json()["devices"]}
    assert status["containers"][0]["devices"][0]["pin"] == pin["metadata"]["name"]
    holders = listed[GPU1.uuid]["holders"]
    assert [(h["pod"], h["pin"]) for h in holders] == [("nb", pin["metadata"]["name"])]
    assert listed[GPU1.uuid]["management"] == "device-plugin"

    # Unmount releases the pin: the waiting pod gets GPU 1 right after.
    with cluster.api(cluster.kube.admin_token) as api:
        assert api.delete(f"{PODS}/trainer-1").status_code == 200
    assert unmount(agent, "nb", "1").status_code == 200
    assert pins_of(cluster, "nb") == []
    wait_for(lambda: given(cluster, "trainer-2") != [], "the waiting pod is scheduled")
    assert len(given(cluster, "trainer-2")) == 1


def test_count_mode_works_while_a_gpu_is_mounted_by_name(cluster: Cluster) -> None:
    cluster.pod("named")
    cluster.pod("counted")
    agent = cluster.agent()
    assert mount(agent, "named", devices=["0"]).status_code == 200
    for _ in range(3):
        counted = mount(agent, "counted", count=1)
        assert counted.status_code == 200, counted.text
        assert [d["uuid"] for d in counted.json()["mounted"]] == [GPU1.uuid]
        assert unmount(agent, "counted", "1").status_code == 200


def test_a_gpu_the_kubelet_gave_away_cannot_be_pinned_and_nothing_is_left(
    cluster: Cluster,
) -> None:
    cluster.pod("nb")
    agent = cluster.agent()
    gpu_pod(cluster, "trainer", gpus=2)
    refused = mount(agent, "nb", devices=["0"])
    assert refused.status_code == 409, refused.text
    assert refused.json()["reason"] == "AllocatedToPod"
    assert pins_of(cluster, "nb") == []
    with agent.client(ALICE) as api:
        assert api.get("/v1/namespaces/default/pods/nb/devices").json()["containers"] == []


def test_pins_are_guaranteed_at_the_targets_priority_and_pinned_by_node_name(
    cluster: Cluster,
) -> None:
    cluster.pod("nb")
    pod = cluster.kube.pod("default", "nb")
    assert pod is not None
    pod["spec"]["priorityClassName"] = "research-high"
    cluster.kube.put_pod(pod)
    agent = cluster.agent(extra=["--holder-priority-classes", "research-high"])
    assert mount(agent, "nb", devices=["0"]).status_code == 200
    [pin] = pins_of(cluster, "nb")
    spec = pin["spec"]
    assert spec["priorityClassName"] == "research-high"
    resources = spec["containers"][0]["resources"]
    assert resources["requests"] == resources["limits"]
    assert {"cpu", "memory"} <= set(resources["limits"])
    [term] = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    assert term["matchFields"] == [{"key": "metadata.name", "operator": "In", "values": ["node-a"]}]
    [owner] = pin["metadata"]["ownerReferences"]
    assert (owner["name"], owner["uid"]) == ("nb", pod["metadata"]["uid"])


def test_a_pin_never_takes_a_priority_class_the_admission_policy_refuses(
    cluster: Cluster,
) -> None:
    """The target's class is not among --holder-priority-classes and there is no fallback
    (--holder-priority-class): the pin has no class, never the target's (the admission
    policy would refuse it, and a class such as this one could preempt any pod)."""
    cluster.pod("nb")
    pod = cluster.kube.pod("default", "nb")
    assert pod is not None
    pod["spec"]["priorityClassName"] = "system-node-critical"
    cluster.kube.put_pod(pod)
    agent = cluster.agent(extra=["--holder-priority-classes", "research-high"])
    assert mount(agent, "nb", devices=["0"]).status_code == 200
    [pin] = pins_of(cluster, "nb")
    assert "priorityClassName" not in pin["spec"]


def test_a_double_booked_gpu_is_reported_on_both_pods_and_taken_back(cluster: Cluster) -> None:
    """The tenant deletes the pin: the kubelet then gives GPU 0 to the next GPU pod while
    the hot-mount still has it. Reconcile says so on both pods and takes it back."""
    container = cluster.pod("nb")
    agent = cluster.agent()
    assert mount(agent, "nb", devices=["0"]).status_code == 200
    [pin] = pins_of(cluster, "nb")
    blockers_gone(cluster)
    waiting = gpu_pod(cluster, "trainer", gpus=2)
    assert waiting["status"]["phase"] == "Pending"  # GPU 0 is pinned
    with cluster.api(cluster.kube.admin_token) as api:
        assert api.delete(f"{PODS}/{pin['metadata']['name']}").status_code == 200
    # The scheduler retries at once: the trainer gets GPU 0 too, still hot-mounted in nb.
    assert given(cluster, "trainer") == sorted([GPU0.uuid, GPU1.uuid])

    def reported() -> bool:
        pods = {e["involvedObject"]["name"] for e in cluster.events("GPUDoubleBooked")}
        return pods == {"nb", "trainer"}

    wait_for(reported, "GPUDoubleBooked Events on both pods", timeout=30)
    assert all(e["type"] == "Warning" for e in cluster.events("GPUDoubleBooked"))
    wait_for(
        lambda: f"nvidia{GPU0.minor}" not in container.ls_dev(),
        "the double-booked GPU is taken back",
        timeout=30,
    )
    wait_for(
        lambda: metric_sum(agent, "hotmount_gpu_double_bookings_taken_back_total ") == 1,
        "the take-back counted",
    )


def test_warn_leaves_a_double_booked_gpu_and_sets_the_gauge(cluster: Cluster) -> None:
    container = cluster.pod("nb")
    cluster.pod("trainer")
    cluster.kubelets["node-a"].set_allocation(
        "default", "trainer", "main", "nvidia.com/gpu", [GPU0.uuid]
    )
    agent = cluster.agent(extra=["--on-double-booking", "warn"])
    forced = mount(agent, "nb", devices=["0"], force=True)  # over the kubelet's books
    assert forced.status_code == 200, forced.text

    wait_for(
        lambda: metric_sum(agent, "hotmount_gpu_double_booked{") == 1,
        "the double-booked gauge",
        timeout=30,
    )
    after_two_reconciles(agent)
    assert f"nvidia{GPU0.minor}" in container.ls_dev()
    assert len(cluster.events("GPUDoubleBooked")) == 2  # once on each pod, not each pass
    assert unmount(agent, "nb").status_code == 200
    wait_for(
        lambda: metric_sum(agent, "hotmount_gpu_double_booked{") == 0,
        "the gauge to clear",
        timeout=30,
    )


def test_a_restarted_agent_keeps_the_pin(cluster: Cluster) -> None:
    cluster.pod("nb")
    agent = cluster.agent(extra=["--holder-orphan-grace", "0"])
    assert mount(agent, "nb", devices=["0"]).status_code == 200
    [pin] = pins_of(cluster, "nb")
    agent.stop()
    again = cluster.agent(extra=["--holder-orphan-grace", "0"])
    after_two_reconciles(again)
    [still] = pins_of(cluster, "nb")
    assert still["metadata"]["uid"] == pin["metadata"]["uid"]
    assert unmount(again, "nb").status_code == 200
    assert pins_of(cluster, "nb") == []


def test_dra_gpu_is_pinned_by_a_resource_claim_for_its_uuid(cluster: Cluster) -> None:
    devices = {f"gpu-{gpu.minor}": ("gpu", gpu.uuid) for gpu in GPUS}
    cluster.kube.put_resource_slice(nvidia_slice("node-a", devices))
    cluster.pod("nb")
    cluster.pod("other")
    agent = cluster.agent()
    with agent.client(ALICE) as api:
        listed = {d["key"]: d for d in api.get("/v1/devices").json()["devices"]}
    assert listed[GPU1.uuid]["management"] == "dra"

    mounted = mount(agent, "nb", devices=["1"])
    assert mounted.status_code == 200, mounted.text
    [pin] = pins_of(cluster, "nb")
    name = pin["metadata"]["name"]
    assert pin["spec"]["resourceClaims"] == [{"name": "gpu", "resourceClaimName": name}]
    limits = pin["spec"]["containers"][0]["resources"]["limits"]
    assert "nvidia.com/gpu" not in limits
    claim = cluster.kube.resource_claim("default", name)
    assert claim is not None
    [request] = claim["spec"]["devices"]["requests"]
    expression = request["exactly"]["selectors"][0]["cel"]["expression"]
    assert GPU1.uuid in expression and "uuid" in expression
    [result] = claim["status"]["allocation"]["devices"]["results"]
    assert result["device"] == f"gpu-{GPU1.minor}"

    # The in-use check reads the kubelet's DRA allocations: another pod is refused.
    refused = mount(agent, "other", devices=["1"])
    assert refused.status_code == 409, refused.text

    assert unmount(agent, "nb", "1").status_code == 200
    assert pins_of(cluster, "nb") == []
    wait_for(
        lambda: cluster.kube.resource_claim("default", name) is None,
        "the pin's ResourceClaim is deleted with it",
    )
    assert mount(agent, "other", devices=["1"]).status_code == 200


def test_a_gpu_nobody_else_manages_needs_no_pin(cluster: Cluster) -> None:
    """A node reserved for hot-mounts: no plugin advertises its GPUs (allocatable 0)."""
    cluster.kubelets["node-a"].set_allocatable("nvidia.com/gpu", [])
    cluster.pod("nb")
    agent = cluster.agent()
    mounted = mount(agent, "nb", devices=["0"])
    assert mounted.status_code == 200, mounted.text
    assert mounted.json()["mounted"][0]["pin"] is None
    assert pins_of(cluster, "nb") == []
    with agent.client(ALICE) as api:
        listed = {d["key"]: d for d in api.get("/v1/devices").json()["devices"]}
    assert listed[GPU0.uuid]["management"] == "unmanaged"
