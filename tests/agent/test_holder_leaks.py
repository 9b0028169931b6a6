"""Holder pods never leak: every way a count mount can end leaves no holder behind.

Each test ends with no holder pod left and the kubelet's books right (every GPU
free in the fake scheduler and in PodResources). The agents run with
`--holder-orphan-grace 0`, so the first reconcile that finds an orphan deletes it;
mounts in progress are protected by the agent's in-flight set, which the last test
attacks.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import httpx
import pytest

from agent.podresources import PodResourcesClient
from tests.agent.conftest import ALICE, METRICS, Cluster
from tests.support.agent import GPUS, AgentProcess
from tests.support.runc import RuncContainer
from tests.support.waiting import wait_for

pytestmark = pytest.mark.kernel
COLLECT_AT_ONCE = ["--holder-orphan-grace", "0"]


def holders(cluster: Cluster) -> list[str]:
    return [
        p["metadata"]["name"]
        for p in cluster.kube.pods()
        if "hotmount.io/holder-for" in (p["metadata"].get("labels") or {})
    ]


def books_are_right(cluster: Cluster) -> None:
    """No holder pod, every GPU free for the scheduler and in the kubelet's PodResources."""
    assert holders(cluster) == []
    assert sorted(cluster.kube.free_devices("node-a")) == sorted(g.uuid for g in GPUS)
    with PodResourcesClient(cluster.kubelets["node-a"].socket_path) as kubelet:
        assert [a for a in kubelet.list_allocations() if a.device_ids] == []


def eventually(condition: Callable[[], bool], what: str, seconds: float = 30) -> None:
    """Reconcile runs every second: wait for its effect (a bound, not a timing claim)."""
    wait_for(condition, f"reconcile to {what}", timeout=seconds, interval=0.2)


def metric_sum(agent: AgentProcess, prefix: str) -> float:
    """The sum of the agent's metric samples whose line starts with `prefix`."""
    with agent.client(METRICS) as api:
        text = api.get("/metrics").text
    return sum(
        float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(prefix)
    )


def reconciles(agent: AgentProcess) -> float:
    return metric_sum(agent, "hotmount_reconciles_total{")


def orphans_deleted(agent: AgentProcess) -> float:
    return metric_sum(agent, "hotmount_orphan_holders_deleted_total ")


def after_two_reconciles(agent: AgentProcess) -> None:
    """Two whole passes have run since now (the first may have started before)."""
    start = reconciles(agent)
    eventually(lambda: reconciles(agent) >= start + 2, "run twice")


def mount_one_by_count(agent: AgentProcess, pod: str = "nb") -> dict:
    with agent.client(ALICE) as api:
        mounted = api.post(f"/v1/namespaces/default/pods/{pod}/devices", json={"count": 1})
    assert mounted.status_code == 200, mounted.text
    return mounted.json()


def test_holder_stays_when_the_target_container_restarts(cluster: Cluster) -> None:
    """The restarted container gets its GPU again (agent/node/remounts.py): its holder is
    no orphan, even with no grace, and the books stay right."""
    old = cluster.pod("nb")
    agent = cluster.agent(extra=COLLECT_AT_ONCE)
    body = mount_one_by_count(agent)
    assert holders(cluster) == [body["holderPod"]]

    # The kubelet restarts the container: a new container ID, same pod.
    old.stop()
    cluster.containers.remove(old)
    new = RuncContainer(cluster.workdir, cluster.rootfs, "v1")
    cluster.containers.append(new)
    pod = cluster.kube.pod("default", "nb")
    status = pod["status"]["containerStatuses"][0]
    status["containerID"], status["restartCount"] = f"containerd://{new.id}", 1
    cluster.kube.put_pod(pod)

    eventually(lambda: new.open_result(f"/dev/nvidia{GPUS[0].minor}") == "ENXIO", "mount it again")
    after_two_reconciles(agent)
    assert holders(cluster) == [body["holderPod"]]
    assert GPUS[0].uuid not in cluster.kube.free_devices("node-a")  # still in its books
    assert orphans_deleted(agent) == 0


def test_holder_goes_when_the_target_pod_is_deleted(cluster: Cluster) -> None:
    container = cluster.pod("nb")
    agent = cluster.agent(extra=COLLECT_AT_ONCE)
    body = mount_one_by_count(agent)
    # The fake API server has no garbage collector: reconcile alone must do it.
    with cluster.api(cluster.kube.admin_token) as admin:
        assert admin.delete("/api/v1/namespaces/default/pods/nb").status_code == 200
    # While the container still runs (terminating), its GPU stays accounted for.
    after_two_reconciles(agent)
    assert holders(cluster) == [body["holderPod"]]

    container.stop()
    cluster.containers.remove(container)

    eventually(lambda: holders(cluster) == [], "delete the holder")
    books_are_right(cluster)


def test_holder_of_an_agent_killed_mid_mount_is_collected_after_restart(
    cluster: Cluster,
) -> None:
    container = cluster.pod("nb")
    # A holder on another node is that node's agent's business.
    cluster.kube.put_pod(
        {
            "metadata": {
                "name": "hotmount-holder-elsewhere",
                "namespace": "default",
                "labels": {
                    "app.kubernetes.io/managed-by": "gpu-hotmount",
                    "hotmount.io/holder-for": "other",
                },
            },
            "spec": {"nodeName": "node-b", "containers": [{"name": "holder", "image": "pause"}]},
            "status": {"phase": "Running"},
        }
    )
    cluster.kube.running_delay = 3600  # the holder never becomes Running
    first = cluster.agent(state="state", extra=COLLECT_AT_ONCE)
    failed: list[BaseException] = []

    def mount() -> None:
        try:
            mount_one_by_count(first)
        except BaseException as exc:  # the agent dies under the request
            failed.append(exc)

    request = threading.Thread(target=mount)
    request.start()
    eventually(lambda: len(holders(cluster)) == 2, "see the holder created", seconds=30)
    first.process.kill()  # SIGKILL between creating the holder and mounting
    first.process.wait()
    request.join()
    assert failed and isinstance(failed[0], httpx.HTTPError | AssertionError)
    [stranded] = [h for h in holders(cluster) if h != "hotmount-holder-elsewhere"]
    assert len(cluster.kube.free_devices("node-a")) == len(GPUS) - 1

    cluster.agent(state="state", extra=COLLECT_AT_ONCE)

    eventually(lambda: cluster.kube.pod("default", stranded) is None, "delete the holder")
    assert holders(cluster) == ["hotmount-holder-elsewhere"]
    with cluster.api(cluster.kube.admin_token) as admin:
        admin.delete("/api/v1/namespaces/default/pods/hotmount-holder-elsewhere")
    books_are_right(cluster)
    assert "nvidia" not in " ".join(container.ls_dev())


def test_moving_a_gpu_mounted_by_count_is_refused_and_changes_nothing(cluster: Cluster) -> None:
    source, target = cluster.pod("a"), cluster.pod("b")
    agent = cluster.agent(extra=COLLECT_AT_ONCE)
    body = mount_one_by_count(agent, "a")
    [device] = body["mounted"]
    node = f"/dev/nvidia{next(g.minor for g in GPUS if g.uuid == device['key'])}"
    with agent.client(ALICE) as api:
        for force in (False, True):
            refused = api.post(
                "/v1/reassign",
                json={
                    "device": device["key"],
                    "from": {"namespace": "default", "pod": "a"},
                    "to": {"namespace": "default", "pod": "b"},
                    "force": force,
                },
            )

            assert refused.status_code == 409, refused.text
            assert refused.json()["reason"] == "MountedByCount"
            message = refused.json()["message"]
            assert body["holderPod"] in message
            assert "mount by count into default/b" in message
        # Nothing changed: still in a, not in b, the holder still accounts for it.
        assert source.open_result(node) == "ENXIO"
        assert target.open_result(node) == "ENOENT"
        after_two_reconciles(agent)
        assert holders(cluster) == [body["holderPod"]]
        assert device["key"] not in cluster.kube.free_devices("node-a")

        unmounted = api.delete(f"/v1/namespaces/default/pods/a/devices/{device['key']}")
        assert unmounted.status_code == 200, unmounted.text
    books_are_right(cluster)


def test_a_mount_in_progress_is_never_taken_for_an_orphan(cluster: Cluster) -> None:
    container = cluster.pod("nb")
    cluster.kube.running_delay = 4  # several reconciles pass while the holder is Pending
    agent = cluster.agent(extra=COLLECT_AT_ONCE)

    body = mount_one_by_count(agent)

    after_two_reconciles(agent)
    assert holders(cluster) == [body["holderPod"]]
    [device] = body["mounted"]
    minor = next(g.minor for g in GPUS if g.uuid == device["key"])
    assert container.open_result(f"/dev/nvidia{minor}") == "ENXIO"


MOVE_GPU0_FROM_A_TO_B = {
    "device": "0",
    "from": {"namespace": "default", "pod": "a"},
    "to": {"namespace": "default", "pod": "b"},
}


def start_move(agent: AgentProcess, moved: list[httpx.Response]) -> threading.Thread:
    """POST the move of GPU 0 from a to b in a thread; its response lands in `moved`."""

    def move() -> None:
        with agent.client(ALICE) as api:
            moved.append(api.post("/v1/reassign", json=MOVE_GPU0_FROM_A_TO_B))

    request = threading.Thread(target=move)
    request.start()
    return request


def assert_moved_with_its_pin(
    cluster: Cluster, moved: list[httpx.Response], pin: str, a: RuncContainer, b: RuncContainer
) -> None:
    [response] = moved
    assert response.status_code == 200, response.text
    assert cluster.kube.pod("default", pin) is not None
    assert cluster.kube.pod("default", pin)["metadata"]["labels"]["hotmount.io/holder-for"] == "b"
    node = f"/dev/nvidia{GPUS[0].minor}"
    assert a.open_result(node) == "ENOENT"
    assert b.open_result(node) == "ENXIO"
    assert GPUS[0].uuid not in cluster.kube.free_devices("node-a")


def mount_by_name(agent: AgentProcess, pod: str, device: str) -> str:
    """Mount `device` into `pod` by name; its pin's name."""
    with agent.client(ALICE) as api:
        done = api.post(f"/v1/namespaces/default/pods/{pod}/devices", json={"devices": [device]})
    assert done.status_code == 200, done.text
    [mounted] = done.json()["mounted"]
    assert mounted["pin"], done.text
    return mounted["pin"]


def test_a_pin_being_moved_is_never_taken_for_an_orphan(cluster: Cluster) -> None:
    """A reassign unmounts at the source, hands the pin over, then mounts at the target:
    in between no ledger record names the pin. Reconcile passes that run then (here made
    to, by holding the hand-over's PATCH) must leave it alone, or the move fails with
    the pin gone (rolled back) and the GPU leaves the scheduler's books."""
    a, b = cluster.pod("a"), cluster.pod("b")
    agent = cluster.agent(extra=COLLECT_AT_ONCE)
    pin = mount_by_name(agent, "a", "0")
    hand_over = cluster.kube.stall(verb="patch", resource="pods")
    moved: list[httpx.Response] = []
    request = start_move(agent, moved)
    try:
        assert hand_over.wait_arrived(1), "the move never reached its hand-over"
        after_two_reconciles(agent)  # with the source unmounted and the pin named nowhere
        assert cluster.kube.pod("default", pin) is not None
    finally:
        hand_over.release()
        request.join()
    assert_moved_with_its_pin(cluster, moved, pin, a, b)
    after_two_reconciles(agent)
    assert sorted(holders(cluster)) == [pin]


def test_a_pass_that_began_before_a_move_leaves_its_pin(cluster: Cluster) -> None:
    """The flake a loaded machine found (default orphan grace): a reconcile pass notes
    the pins the ledger names, then deletes those named nowhere once the engine's
    reconcile is done, a sweep meant for the pins of dead containers. A move whose
    unmount lands in between had its pin deleted under it (404 PodNotFound on the hand-
    over, or "the pin is gone"). Here the pass is held in between, by a dead container's
    kept mount whose pod it looks up, while the move unmounts."""
    a, b, c = cluster.pod("a"), cluster.pod("b"), cluster.pod("c")
    agent = cluster.agent()
    pin = mount_by_name(agent, "a", "0")
    other_pin = mount_by_name(agent, "c", "1")
    # c's container dies and is not restarted yet: each pass looks up pod c for it.
    looking_up_c = cluster.kube.stall(verb="get", resource="pods", name="c")
    hand_over = cluster.kube.stall(verb="patch", resource="pods")
    c.stop()
    cluster.containers.remove(c)
    moved: list[httpx.Response] = []
    request = None
    try:
        assert looking_up_c.wait_arrived(1), "no pass kept c's mount for its successor"
        request = start_move(agent, moved)  # the pass is between its note and its sweep
        assert hand_over.wait_arrived(1), "the move never reached its hand-over"
        looking_up_c.release()
        after_two_reconciles(agent)
        assert cluster.kube.pod("default", pin) is not None
    finally:
        looking_up_c.release()
        hand_over.release()
        if request is not None:
            request.join()
    assert_moved_with_its_pin(cluster, moved, pin, a, b)
    assert sorted(holders(cluster)) == sorted([pin, other_pin])  # c's waits for its successor
