"""Suspend and resume over HTTP (issue 33): a real agent process with the stand-in driver
(tests/support/cuda_standin.py), real runc containers, the fake cluster."""

from __future__ import annotations

import pytest

from tests.agent.conftest import ALICE, BOB, DANA, METRICS, OLGA, shipped_role
from tests.support.cuda_standin import (
    MODEL,
    UUID_A,
    A,
    B,
    container_pid,
    gpu_fds,
    status,
)
from tests.support.runc import RuncContainer
from tests.support.suspend_world import World, standin_fixture, world_fixture  # noqa: F401 (fixtures)

pytestmark = pytest.mark.kernel
PODS = "/v1/namespaces/default/pods"
GPUMOUNTS = "/apis/hotmount.io/v1alpha1/namespaces/default/gpumounts"
NOTEBOOKS = "system:serviceaccount:default:notebook"  # one account for the notebooks' pods
POD_NAME, POD_UID = "authentication.kubernetes.io/pod-name", "authentication.kubernetes.io/pod-uid"


def test_suspend_then_resume(world: World) -> None:
    container, pid = world.notebook()
    with world.agent.client(ALICE) as api:
        suspended = api.post(f"{PODS}/nb/suspend", json={})
        assert suspended.status_code == 200, suspended.text
        body = suspended.json()
        assert body["suspended"] == [A] and body["container"] == "main"
        # the PID the container sees (its own PID namespace), never the host's
        assert container_pid(pid) != pid
        assert body["processes"] == [{"pid": container_pid(pid), "gpuBytes": 512 << 20}]
        assert body["hostBytes"] == 512 << 20
        assert status(container) == "checkpointed - pattern=ok"

        [listed] = api.get(f"{PODS}/nb/devices").json()["containers"][0]["devices"]
        assert listed["state"] == "suspended" and listed["paths"] == [] and listed["key"] == A
        # `kubectl get gpumounts` lists it, though none of its GPUs is mounted now
        gpumounts = api.get("/apis/hotmount.io/v1alpha1/namespaces/default/gpumounts").json()
        [item] = [i for i in gpumounts["items"] if i["metadata"]["name"] == "nb"]
        [shown] = item["status"]["containers"][0]["devices"]
        assert shown["state"] == "suspended" and shown["key"] == A, item
        with world.agent.client(METRICS) as scraper:
            assert "hotmount_suspended_gpus 1.0" in scraper.get("/metrics").text

        resumed = api.post(f"{PODS}/nb/resume", json={})
        assert resumed.status_code == 200, resumed.text
        assert resumed.json()["resumed"] == {A: A}
        assert resumed.json()["processes"] == [{"pid": container_pid(pid), "gpuBytes": 512 << 20}]
        assert status(container) == "running /dev/nvidia0 pattern=ok"
        [listed] = api.get(f"{PODS}/nb/devices").json()["containers"][0]["devices"]
        assert listed["state"] == "mounted" and listed["paths"] == ["/dev/nvidia0"]
        with world.agent.client(METRICS) as scraper:
            assert "hotmount_suspended_gpus 0.0" in scraper.get("/metrics").text
    [event] = world.cluster.events("GPUSuspended")
    assert "1 processes kept, 512 MiB of GPU memory in host memory" in event["message"]
    assert world.cluster.events("GPUResumed")


def test_a_lock_timeout_over_the_cap_is_refused_before_anything_changes(world: World) -> None:
    """`lockTimeoutSeconds` is at most 30 (hotmount/wire/schemas.py MAX_LOCK_TIMEOUT): the lock
    wait holds the container's lock, and reconcile's repairs of that container wait
    meanwhile. More is a 422 naming the field and the cap; 30 itself is taken."""
    container, _ = world.notebook()
    with world.agent.client(ALICE) as api:
        refused = api.post(f"{PODS}/nb/suspend", json={"lockTimeoutSeconds": 30.5})
        assert refused.status_code == 422, refused.text
        body = refused.json()
        assert body["reason"] == "Invalid"
        assert "lockTimeoutSeconds" in body["message"] and "30" in body["message"], body
        assert status(container) == "running /dev/nvidia0 pattern=ok"

        done = api.post(f"{PODS}/nb/suspend", json={"lockTimeoutSeconds": 30})
        assert done.status_code == 200, done.text
    assert status(container) == "checkpointed - pattern=ok"


def test_resume_onto_a_named_gpu_and_no_gpu_free(world: World) -> None:
    container, _ = world.notebook()
    world.cluster.pod("other")
    with world.agent.client(ALICE) as api:
        assert api.post(f"{PODS}/nb/suspend", json={}).status_code == 200
        taken = api.post(f"{PODS}/other/devices", json={"devices": [A, B]})
        assert taken.status_code == 200, taken.text

        refused = api.post(f"{PODS}/nb/resume", json={})
        assert refused.status_code == 409, refused.text
        assert refused.json()["reason"] == "NoGpuFree"
        assert refused.json()["message"] == f"no GPU of model {MODEL} is free on this node"
        assert status(container) == "checkpointed - pattern=ok"

        for gpu in (A, B):  # both free again: without `mount` the resume would take A
            assert api.delete(f"{PODS}/other/devices/{gpu}").status_code == 200
        resumed = api.post(f"{PODS}/nb/resume", json={"mount": [B]})
        assert resumed.status_code == 200, resumed.text
        assert resumed.json()["resumed"] == {A: B}
        assert status(container) == "running /dev/nvidia1 pattern=ok"


def test_resume_avoids_a_gpu_the_kubelet_gave_another_pod(world: World) -> None:
    container, _ = world.notebook()
    world.cluster.pod("trainer")
    with world.agent.client(ALICE) as api:
        assert api.post(f"{PODS}/nb/suspend", json={}).status_code == 200
        world.cluster.kubelets["node-a"].set_allocation(
            "default", "trainer", "main", "nvidia.com/gpu", [UUID_A]
        )
        resumed = api.post(f"{PODS}/nb/resume", json={})
    assert resumed.status_code == 200, resumed.text
    assert resumed.json()["resumed"] == {A: B}
    assert status(container) == "running /dev/nvidia1 pattern=ok"


def test_suspend_and_resume_need_the_mount_verbs(world: World) -> None:
    container, _ = world.notebook()
    with world.agent.client(BOB) as api:
        refused = api.post(f"{PODS}/nb/suspend", json={})
    assert refused.status_code == 403, refused.text
    assert status(container) == "running /dev/nvidia0 pattern=ok"
    asked = world.cluster.kube.reviews("SubjectAccessReview")
    reviews = [r["spec"]["resourceAttributes"] for r in asked if r["spec"].get("user") == "bob"]
    assert {"verb": "delete", "resource": "gpumounts"}.items() <= reviews[-1].items()


def still_running(container: RuncContainer, pid: int) -> None:
    """Nothing changed: the process runs on GPU A, neither locked nor checkpointed."""
    assert status(container) == "running /dev/nvidia0 pattern=ok"
    assert gpu_fds(pid) == ["/dev/nvidia0", "/dev/nvidiactl"]


def test_suspending_a_held_gpu_needs_force_as_unmounting_it_does(world: World) -> None:
    """Issue 40: a suspend takes a busy GPU from the processes that hold it, as a forced
    unmount does. dana (the shipped hotmount-user in `default`, no `force`) may not
    unmount it (409) and may not suspend it either (403, `force` asked), and nothing
    changes; olga (hotmount-admin) may."""
    container, pid = world.notebook()
    with world.agent.client(DANA) as api:
        busy = api.delete(f"{PODS}/nb/devices/{A}")
        assert busy.status_code == 409, busy.text
        assert busy.json()["reason"] == "DeviceBusy"

        refused = api.post(f"{PODS}/nb/suspend", json={})
        assert refused.status_code == 403, refused.text
        body = refused.json()
        assert body["reason"] == "Forbidden"
        assert 'user "dana" cannot force gpumounts.hotmount.io' in body["message"]
        assert "1 process holds" in body["message"], body["message"]
        assert body["details"] == {"group": "hotmount.io", "kind": "gpumounts", "name": "nb"}
        still_running(container, pid)
        [listed] = api.get(f"{PODS}/nb/devices").json()["containers"][0]["devices"]
        assert listed["state"] == "mounted" and listed["paths"] == ["/dev/nvidia0"]
    asked = world.cluster.kube.reviews("SubjectAccessReview")
    dana = [r["spec"]["resourceAttributes"] for r in asked if r["spec"].get("user") == "dana"]
    assert any({"verb": "force", "name": "nb"}.items() <= r.items() for r in dana), dana
    assert not world.cluster.events("GPUSuspended")

    with world.agent.client(OLGA) as api:
        done = api.post(f"{PODS}/nb/suspend", json={})
    assert done.status_code == 200, done.text
    assert status(container) == "checkpointed - pattern=ok"


def test_suspending_a_gpu_no_process_holds_needs_only_delete(world: World) -> None:
    """Nobody to take it from: dana's `delete` is enough, as for an unmount."""
    world.cluster.pod("idle")
    with world.agent.client(ALICE) as api:
        assert api.post(f"{PODS}/idle/devices", json={"devices": [A]}).status_code == 200
    with world.agent.client(DANA) as api:
        done = api.post(f"{PODS}/idle/suspend", json={})
        assert done.status_code == 200, done.text
        assert done.json()["suspended"] == [A] and done.json()["processes"] == []
        back = api.post(f"{PODS}/idle/resume", json={})
        assert back.status_code == 200, back.text
    asked = world.cluster.kube.reviews("SubjectAccessReview")
    verbs = {
        r["spec"]["resourceAttributes"]["verb"] for r in asked if r["spec"].get("user") == "dana"
    }
    assert "force" not in verbs


def test_through_the_api_server_a_held_gpu_needs_force_too(world: World) -> None:
    """The aggregated face (POST gpumounts/{pod}/suspend): the API server lets dana
    `create gpumounts/suspend`, the agent still asks `force` for a held GPU. olga's
    answer names the process by its PID in the container."""
    container, pid = world.notebook()
    world.behind_the_api_server()
    with world.cluster.api(DANA) as api:
        refused = api.post(f"{GPUMOUNTS}/nb/suspend", json={})
    assert refused.status_code == 403, refused.text
    assert "cannot force gpumounts" in refused.json()["message"]
    still_running(container, pid)

    with world.cluster.api(OLGA) as api:
        done = api.post(f"{GPUMOUNTS}/nb/suspend", json={})
    assert done.status_code == 200, done.text
    processes = done.json()["status"]["processes"]
    assert processes == [{"pid": container_pid(pid), "gpuBytes": 512 << 20}]
    assert status(container) == "checkpointed - pattern=ok"


def test_a_pods_own_token_suspends_its_busy_gpu_without_force(world: World) -> None:
    """`%gpu suspend` in a notebook: the pod's own bound token (its TokenReview names the
    pod by name and UID) suspends the pod's own kernel with hotmount-user alone, as the
    idle policy `suspend` does: the pod acting on itself takes no one else's GPU. The
    same account's token bound to another pod, or to an earlier pod of that name, needs
    `force` as anyone does. Through the API server the token's extras come as
    X-Remote-Extra- headers, and decide the same."""
    container, pid = world.notebook()
    world.cluster.pod("other")
    kube = world.cluster.kube
    uid = {name: kube.pod("default", name)["metadata"]["uid"] for name in ("nb", "other")}
    bound = {"nb-token": ("nb", uid["nb"]), "other-token": ("other", uid["other"]),
             "old-nb-token": ("nb", "5f0c1f4e-0000-4000-8000-000000000000")}  # fmt: skip
    for token, (pod, pod_uid) in bound.items():
        extra = {POD_NAME: [pod], POD_UID: [pod_uid]}
        kube.add_token(token, NOTEBOOKS, ["system:serviceaccounts"], extra=extra)
    kube.bind_role(shipped_role("hotmount-user"), user=NOTEBOOKS, namespace="default")

    for stranger in ("other-token", "old-nb-token"):
        with world.agent.client(stranger) as api:
            refused = api.post(f"{PODS}/nb/suspend", json={})
        assert refused.status_code == 403, refused.text
        assert "cannot force gpumounts" in refused.json()["message"]
        still_running(container, pid)
    with world.agent.client("nb-token") as api:
        done = api.post(f"{PODS}/nb/suspend", json={})
        assert done.status_code == 200, done.text
        assert status(container) == "checkpointed - pattern=ok"
        assert api.post(f"{PODS}/nb/resume", json={}).status_code == 200
    still_running(container, pid)

    world.behind_the_api_server()
    with world.cluster.api("other-token") as api:
        assert api.post(f"{GPUMOUNTS}/nb/suspend", json={}).status_code == 403
    with world.cluster.api("nb-token") as api:
        done = api.post(f"{GPUMOUNTS}/nb/suspend", json={})
    assert done.status_code == 200, done.text
    assert status(container) == "checkpointed - pattern=ok"
