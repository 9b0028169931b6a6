"""Suspend and resume over HTTP (issue 33): a real agent process with the stand-in driver
(tests/support/cuda_standin.py), real runc containers, the fake cluster."""

from __future__ import annotations

import pytest

from tests.agent.conftest import ALICE, BOB, METRICS
from tests.support.cuda_standin import (
    MODEL,
    UUID_A,
    A,
    B,
    status,
)
from tests.support.suspend_world import World, standin_fixture, world_fixture  # noqa: F401 (fixtures)

pytestmark = pytest.mark.kernel
PODS = "/v1/namespaces/default/pods"


def test_suspend_then_resume(world: World) -> None:
    container, pid = world.notebook()
    with world.agent.client(ALICE) as api:
        suspended = api.post(f"{PODS}/nb/suspend", json={})
        assert suspended.status_code == 200, suspended.text
        body = suspended.json()
        assert body["suspended"] == [A] and body["container"] == "main"
        assert body["processes"] == [{"pid": pid, "gpuBytes": 512 << 20}]
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
        assert status(container) == "running /dev/nvidia0 pattern=ok"
        [listed] = api.get(f"{PODS}/nb/devices").json()["containers"][0]["devices"]
        assert listed["state"] == "mounted" and listed["paths"] == ["/dev/nvidia0"]
        with world.agent.client(METRICS) as scraper:
            assert "hotmount_suspended_gpus 0.0" in scraper.get("/metrics").text
    [event] = world.cluster.events("GPUSuspended")
    assert "1 processes kept, 512 MiB of GPU memory in host memory" in event["message"]
    assert world.cluster.events("GPUResumed")


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
