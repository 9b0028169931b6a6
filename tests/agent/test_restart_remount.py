"""A container that restarts keeps its hot-mounted GPUs (agent/node/remounts.py).

The kubelet's restart, as the agent sees it: the container dies and a new one, with a
new ID, runs in the same pod (same UID). Real runc containers on both sides; the pod's
status in the fake API server names the new container, as the kubelet would report it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.agent.conftest import ALICE, Cluster
from tests.agent.test_accounting import pins_of
from tests.agent.test_driver_api import plain_pod, plain_rootfs, smi
from tests.agent.test_idle_reclaim import wait_passes
from tests.fakes import driver as stand_in
from tests.fakes import nvml
from tests.support.agent import GPUS, pod_manifest
from tests.support.runc import RuncContainer
from tests.support.waiting import wait_for

pytestmark = pytest.mark.kernel
GPU0 = GPUS[0]
NVIDIA0 = f"/dev/nvidia{GPU0.minor}"
MOUNTS = "/v1/namespaces/default/pods/nb/devices"


def restart(
    cluster: Cluster, pod: str, old: RuncContainer, running: bool = True, rootfs: Path | None = None
) -> RuncContainer:
    """`old` dies; a new container takes its place in the pod (Running, or waiting in a
    crash-loop back-off when not `running`), from the same image (`rootfs`)."""
    old.stop()
    new = RuncContainer(cluster.workdir, rootfs or cluster.rootfs, "v2")
    cluster.containers.append(new)
    manifest = cluster.kube.pod("default", pod)
    assert manifest is not None
    [status] = manifest["status"]["containerStatuses"]
    if running:
        status["containerID"] = f"containerd://{new.id}"
        status["state"] = {"running": {"startedAt": "2026-11-24T00:00:00Z"}}
    else:
        status["state"] = {"waiting": {"reason": "CrashLoopBackOff"}}
    status["restartCount"] = status.get("restartCount", 0) + 1
    cluster.kube.put_pod(manifest)
    return new


def now_running(cluster: Cluster, pod: str, container: RuncContainer) -> None:
    manifest = cluster.kube.pod("default", pod)
    assert manifest is not None
    [status] = manifest["status"]["containerStatuses"]
    status["containerID"] = f"containerd://{container.id}"
    status["state"] = {"running": {"startedAt": "2026-11-24T00:01:00Z"}}
    cluster.kube.put_pod(manifest)


def remounted(cluster: Cluster, new: RuncContainer, node: str = NVIDIA0) -> dict[str, object]:
    """Wait (bounded) until the agent's remount is done, not merely under way: its
    GPURemounted Event is recorded once the mount returned (records saved, the driver's
    files placed), while the device node appears midway. Then the node opens."""
    [event] = wait_for(
        lambda: cluster.events("GPURemounted"),
        "the next reconcile mounts the GPU again into the new container",
        show=lambda: new.open_result(node),
    )
    assert new.open_result(node) == "ENXIO"
    return event


def test_a_restarted_container_gets_its_gpu_again_with_the_same_pin(cluster: Cluster) -> None:
    old = cluster.pod("nb", mode="v2")
    agent = cluster.agent()
    with agent.client(ALICE) as api:
        made = api.post(MOUNTS, json={"devices": ["0"], "idleTimeout": "30m"})
        assert made.status_code == 200, made.text
    [pin] = pins_of(cluster, "nb")

    new = restart(cluster, "nb", old)
    event = remounted(cluster, new)

    assert [p["metadata"]["uid"] for p in pins_of(cluster, "nb")] == [pin["metadata"]["uid"]]
    assert GPU0.uuid in str(event["message"]) and "main" in str(event["message"])
    with agent.client(ALICE) as api:
        status = api.get(MOUNTS).json()
    [container] = status["containers"]
    assert container["containerId"] == new.id
    [device] = container["devices"]
    assert (device["key"], device["pin"]) == (GPU0.uuid, pin["metadata"]["name"])
    assert device["idleTimeout"] == "30m"
    # The new claim names the pod, as a refusal to another tenant would.
    claims = [
        json.loads(p.read_text()) for p in (cluster.workdir / "state-node-a" / "claims").iterdir()
    ]
    [claim] = [c for c in claims if c["device"] == GPU0.uuid]
    assert (claim["owner"], claim["holder"]) == (
        new.id,
        {"namespace": "default", "pod": "nb", "container": "main"},
    )


def test_a_gpu_waits_in_the_pods_books_while_its_container_is_backing_off(
    cluster: Cluster,
) -> None:
    """Between the crash and the next start no container has the GPU, but its pin stays
    (another pod is not given it), and it comes back with the container."""
    old = cluster.pod("nb", mode="v2")
    agent = cluster.agent()
    with agent.client(ALICE) as api:
        assert api.post(MOUNTS, json={"devices": ["0"]}).status_code == 200
    [pin] = pins_of(cluster, "nb")

    new = restart(cluster, "nb", old, running=False)
    wait_passes(agent, 3)
    assert [p["metadata"]["uid"] for p in pins_of(cluster, "nb")] == [pin["metadata"]["uid"]]
    assert new.open_result(NVIDIA0) == "ENOENT"

    now_running(cluster, "nb", new)
    remounted(cluster, new)  # GPU 0 back once it runs


def test_a_deleted_pod_leaves_no_intent_nor_pin(cluster: Cluster) -> None:
    old = cluster.pod("nb", mode="v2")
    agent = cluster.agent()
    with agent.client(ALICE) as api:
        assert api.post(MOUNTS, json={"devices": ["0"]}).status_code == 200
    restart(cluster, "nb", old, running=False)
    wait_passes(agent, 2)
    intents = cluster.workdir / "state-node-a" / "intents"
    assert pins_of(cluster, "nb") and list(intents.iterdir())

    with cluster.api(cluster.kube.admin_token) as admin:
        assert admin.delete("/api/v1/namespaces/default/pods/nb").status_code == 200
    wait_for(lambda: not pins_of(cluster, "nb"), "the pin goes with the pod")
    assert not list(intents.iterdir())
    assert not cluster.events("GPURemounted")


def test_a_pod_that_finished_leaves_no_intent_nor_pin(cluster: Cluster) -> None:
    """restartPolicy Never (or OnFailure, succeeded): the container is never started
    again, so nothing waits for it."""
    old = cluster.pod("nb", mode="v2")
    agent = cluster.agent()
    with agent.client(ALICE) as api:
        assert api.post(MOUNTS, json={"devices": ["0"]}).status_code == 200
    old.stop()
    manifest = cluster.kube.pod("default", "nb")
    assert manifest is not None
    manifest["status"]["phase"] = "Failed"
    manifest["status"]["containerStatuses"][0]["state"] = {"terminated": {"exitCode": 1}}
    cluster.kube.put_pod(manifest)
    wait_for(lambda: not pins_of(cluster, "nb"), "the pin goes with the finished pod")
    assert not list((cluster.workdir / "state-node-a" / "intents").iterdir())


def test_a_new_pod_of_the_same_name_is_not_given_the_old_pods_gpu(cluster: Cluster) -> None:
    old = cluster.pod("nb", mode="v2")
    agent = cluster.agent()
    with agent.client(ALICE) as api:
        assert api.post(MOUNTS, json={"devices": ["0"]}).status_code == 200
    old.stop()
    namesake = RuncContainer(cluster.workdir, cluster.rootfs, "v2")
    cluster.containers.append(namesake)
    cluster.kube.put_pod(pod_manifest("nb", namesake))  # a new UID
    wait_for(lambda: not pins_of(cluster, "nb"), "the old pod's pin is let go")
    assert namesake.open_result(NVIDIA0) == "ENOENT"
    assert not cluster.events("GPURemounted")


def test_a_mount_by_count_keeps_its_holder_and_its_gpu_across_a_restart(
    cluster: Cluster,
) -> None:
    old = cluster.pod("nb", mode="v2")
    agent = cluster.agent()
    with agent.client(ALICE) as api:
        made = api.post(MOUNTS, json={"count": 1})
        assert made.status_code == 200, made.text
    holder = made.json()["holderPod"]
    [gpu] = [d["key"] for d in made.json()["mounted"]]
    node = next(f"/dev/nvidia{g.minor}" for g in GPUS if g.uuid == gpu)
    uid = cluster.kube.pod("default", holder)["metadata"]["uid"]  # type: ignore[index]

    new = restart(cluster, "nb", old)
    remounted(cluster, new, node)  # the same GPU in the new container
    assert cluster.kube.pod("default", holder)["metadata"]["uid"] == uid  # type: ignore[index]
    with agent.client(ALICE) as api:
        [container] = api.get(MOUNTS).json()["containers"]
    assert [(d["key"], d["holder"]) for d in container["devices"]] == [(gpu, holder)]


def test_an_unmount_while_the_container_is_down_drops_what_it_would_get_again(
    cluster: Cluster,
) -> None:
    old = cluster.pod("nb", mode="v2")
    agent = cluster.agent()
    with agent.client(ALICE) as api:
        assert api.post(MOUNTS, json={"devices": ["0"]}).status_code == 200
    new = restart(cluster, "nb", old, running=False)
    wait_passes(agent, 2)

    with agent.client(ALICE) as api:
        gone = api.delete(f"{MOUNTS}/0")
    assert gone.status_code == 200, gone.text
    assert gone.json()["unmounted"] == [GPU0.uuid]
    assert gone.json()["holderPodsDeleted"] and not pins_of(cluster, "nb")

    now_running(cluster, "nb", new)
    wait_passes(agent, 2)
    assert new.open_result(NVIDIA0) == "ENOENT"
    assert not cluster.events("GPURemounted")


def test_a_mount_asked_once_is_not_carried_across_a_restart(cluster: Cluster) -> None:
    old = cluster.pod("nb", mode="v2")
    agent = cluster.agent()
    with agent.client(ALICE) as api:
        assert api.post(MOUNTS, json={"devices": ["0"], "once": True}).status_code == 200
    assert pins_of(cluster, "nb")

    new = restart(cluster, "nb", old)
    wait_for(lambda: not pins_of(cluster, "nb"), "its pin goes with the dead container")
    wait_passes(agent, 2)
    assert new.open_result(NVIDIA0) == "ENOENT"
    assert not cluster.events("GPURemounted")


@pytest.mark.skipif(nvml.gcc() is None, reason="gcc builds the stand-in driver")
@pytest.mark.parametrize(
    ("with_driver", "node_default"), [(True, "auto"), (False, "always")], ids=["had", "had-not"]
)
def test_a_restarted_container_gets_the_driver_files_again_as_its_first_mount_had_them(
    cluster: Cluster, tmp_path_factory: pytest.TempPathFactory, with_driver: bool, node_default: str
) -> None:
    """The first mount's withDriver, not the node's default, decides for the successor:
    with `always` it gets none. (`never` is an off switch: withDriver cannot be asked.)

    A remount places the driver's files before the device node; still, the test waits
    for the remount to finish (its Event), not for the node, before it runs nvidia-smi:
    a stand-in run between the node and the files failed CI once."""
    driver_root = stand_in.build_root(tmp_path_factory.mktemp("driver"))
    old = plain_pod(cluster)
    agent = cluster.agent(
        extra=["--driver-root", str(driver_root), "--inject-driver", node_default]
    )
    with agent.client(ALICE) as api:
        made = api.post(MOUNTS, json={"devices": ["0"], "withDriver": with_driver})
        assert made.status_code == 200, made.text
    assert (smi(old)[0] == 0) is with_driver

    # a new container has a new root from the same image, as the runtime's snapshot is
    new = restart(cluster, "nb", old, rootfs=plain_rootfs(cluster.workdir / "image-nb-again"))
    remounted(cluster, new)

    if with_driver:  # the driver's files come after the node: wait for what is asserted
        wait_for(lambda: smi(new)[0] == 0, "the driver files in the new container",
                 show=lambda: smi(new)[1])  # fmt: skip
    code, out = smi(new)
    assert (code == 0) is with_driver, out
    with agent.client(ALICE) as api:
        [container] = api.get(MOUNTS).json()["containers"]
    assert container["containerId"] == new.id
