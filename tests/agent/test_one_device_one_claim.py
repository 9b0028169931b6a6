"""One physical device, one holder, over HTTP: every name of a GPU, every kubelet ID form,
several containers of one pod, and sharing across pods only on purpose.

The agent's GPU index 0 is /dev/nvidia3 (195:3). An extra CDI spec, as nvidia-ctk
writes one, names it again (`=GPU-<uuid>`, `=all`) and carves a MIG instance from it
(`=0:0`, also named by its MIG UUID).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.agent.conftest import ALICE, Cluster
from tests.agent.test_accounting import blockers_gone
from tests.fakes.kube_apiserver import AccessRule
from tests.support.agent import GPUS, AgentProcess, pod_manifest
from tests.support.runc import RuncContainer

pytestmark = pytest.mark.kernel
GPU0, GPU1 = GPUS
MIG_UUID = "MIG-5c2a9d1e-0000-4000-8000-000000000000"
NODE0 = f"{{path: /dev/nvidia{GPU0.minor}, type: c, major: 195, minor: {GPU0.minor}}}"
NODE1 = f"{{path: /dev/nvidia{GPU1.minor}, type: c, major: 195, minor: {GPU1.minor}}}"
CAPS = """
        - {path: /dev/nvidia-caps/nvidia-cap21, type: c, major: 239, minor: 21}
        - {path: /dev/nvidia-caps/nvidia-cap22, type: c, major: 239, minor: 22}"""
NVIDIA_CTK_SPEC = f"""\
cdiVersion: 0.6.0
kind: nvidia.com/gpu
devices:
  - name: {GPU0.uuid}
    containerEdits: {{deviceNodes: [{NODE0}]}}
  - name: "0:0"
    containerEdits:
      deviceNodes:
        - {NODE0}{CAPS}
  - name: {MIG_UUID}
    containerEdits:
      deviceNodes:
        - {NODE0}{CAPS}
  - name: all
    containerEdits: {{deviceNodes: [{NODE0}, {NODE1}]}}
"""
CTK_ALIAS, MIG, ALL = f"nvidia.com/gpu={GPU0.uuid}", "nvidia.com/gpu=0:0", "nvidia.com/gpu=all"
CAROL = "carol-token"  # may create gpumounts on pod `consumer` only


def agent_with_aliases(cluster: Cluster, tmp_path: Path) -> AgentProcess:
    spec_dir = tmp_path / "nvidia-ctk"
    spec_dir.mkdir(exist_ok=True)
    (spec_dir / "nvidia.yaml").write_text(NVIDIA_CTK_SPEC)
    return cluster.agent(extra=["--cdi-dir", str(spec_dir)])


def mount(api: Any, pod: str, **body: Any) -> Any:
    return api.post(f"/v1/namespaces/default/pods/{pod}/devices", json=body)


def devices(api: Any) -> dict[str, dict[str, Any]]:
    return {d["key"]: d for d in api.get("/v1/devices").json()["devices"]}


@pytest.mark.parametrize("name", [CTK_ALIAS, ALL, MIG, GPU0.uuid])
def test_every_name_of_a_hot_mounted_gpu_is_409_naming_the_holder(
    cluster: Cluster, tmp_path: Path, name: str
) -> None:
    cluster.pod("a")
    b = cluster.pod("b", mode="v2")
    agent = agent_with_aliases(cluster, tmp_path)
    with agent.client(ALICE) as api:
        assert mount(api, "a", devices=["0"]).status_code == 200
        before = b.ls_dev()

        refused = mount(api, "b", devices=[name])

        assert refused.status_code == 409, refused.text
        status = refused.json()
        assert status["reason"] == "DeviceClaimed" and "default/a" in status["message"]
        [holder] = status["details"]["holders"]
        assert (holder["pod"], holder["device"]) == ("a", GPU0.uuid)
        assert b.ls_dev() == before
        assert api.get("/v1/namespaces/default/pods/b/devices").json()["containers"] == []


def test_cdi_aliases_fold_into_the_gpu_they_name(cluster: Cluster, tmp_path: Path) -> None:
    cluster.pod("a")
    agent = agent_with_aliases(cluster, tmp_path)
    with agent.client(ALICE) as api:
        assert mount(api, "a", devices=[ALL]).status_code == 200
        blockers_gone(cluster)  # they go a moment after the answer, then hold nothing
        listed = devices(api)

    assert CTK_ALIAS not in listed and f"nvidia.com/gpu={MIG_UUID}" not in listed
    assert CTK_ALIAS in listed[GPU0.uuid]["aliases"]
    assert f"nvidia.com/gpu={MIG_UUID}" in listed[MIG]["aliases"]
    # `=all` holds both GPUs and the MIG instance: the in-use view is physical.
    for key in (GPU0.uuid, GPU1.uuid, MIG):
        [holder] = listed[key]["holders"]
        assert (holder["pod"], holder["device"]) == ("a", ALL)


@pytest.mark.parametrize(
    ("kubelet_id", "via_dra"),
    [(f"{GPU0.uuid}::1", False), (MIG_UUID, False), (CTK_ALIAS, True), (MIG, True)],
    ids=["time-sliced-uuid", "mig-uuid", "cdi-name-from-dra", "cdi-mig-name-from-dra"],
)
def test_a_kubelet_id_of_any_form_holds_the_physical_gpu(
    cluster: Cluster, tmp_path: Path, kubelet_id: str, via_dra: bool
) -> None:
    nb = cluster.pod("nb")
    cluster.pod("trainer")
    kubelet = cluster.kubelets["node-a"]
    if via_dra:
        kubelet.set_cdi_allocation("default", "trainer", "main", "gpu-claim", [kubelet_id])
    else:
        kubelet.set_allocation("default", "trainer", "main", "nvidia.com/gpu", [kubelet_id])
    agent = agent_with_aliases(cluster, tmp_path)
    with agent.client(ALICE) as api:
        refused = mount(api, "nb", devices=["0"])

        assert refused.status_code == 409, refused.text
        assert refused.json()["reason"] == "AllocatedToPod"
        assert "default/trainer" in refused.json()["message"]
        assert f"nvidia{GPU0.minor}" not in nb.ls_dev()
        holders = devices(api)[GPU0.uuid]["holders"]
        assert [(h["source"], h["pod"], h["device"]) for h in holders] == [
            ("kubelet", "trainer", kubelet_id)
        ]
        assert mount(api, "nb", devices=["1"]).status_code == 200  # the other GPU is free


def two_container_pod(cluster: Cluster, name: str) -> list[RuncContainer]:
    made = [RuncContainer(cluster.workdir, cluster.rootfs, "v1") for _ in range(2)]
    cluster.containers.extend(made)
    manifest = pod_manifest(name, made[0])
    second = {**manifest["status"]["containerStatuses"][0], "name": "side"}
    second["containerID"] = f"containerd://{made[1].id}"
    manifest["status"]["containerStatuses"].append(second)
    manifest["spec"]["containers"].append({"name": "side", "image": "busybox"})
    manifest["spec"]["shareProcessNamespace"] = True
    cluster.kube.put_pod(manifest)
    return made


@pytest.mark.parametrize("containers", [["*"], ["main", "side"]], ids=["star", "both-named"])
def test_one_gpu_into_several_containers_of_one_pod(
    cluster: Cluster, containers: list[str]
) -> None:
    main, side = two_container_pod(cluster, "ipc")
    agent = cluster.agent()
    with agent.client(ALICE) as api:
        done = mount(api, "ipc", devices=["0"], containers=containers)

        assert done.status_code == 200, done.text
        body = done.json()
        assert [c["container"] for c in body["containers"]] == ["main", "side"]
        node = f"/dev/nvidia{GPU0.minor}"
        assert main.open_result(node) == side.open_result(node) == "ENXIO"
        # A single later container, the old way, is the same pod: no force needed.
        again = mount(api, "ipc", devices=["0"], container="side")
        assert again.status_code == 200 and again.json()["alreadyMounted"]
        holders = devices(api)[GPU0.uuid]["holders"]
        assert sorted(h["container"] for h in holders) == ["main", "side"]


def test_several_containers_all_or_none(cluster: Cluster) -> None:
    main, side = two_container_pod(cluster, "ipc")
    cluster.pod("other")
    agent = cluster.agent()
    with agent.client(ALICE) as api:
        assert mount(api, "other", devices=["1"]).status_code == 200
        refused = mount(api, "ipc", devices=["0", "1"], containers=["*"])
        assert refused.status_code == 409, refused.text
    assert f"nvidia{GPU0.minor}" not in main.ls_dev() + side.ls_dev()


def test_sharing_across_pods_only_on_purpose(cluster: Cluster) -> None:
    producer = cluster.pod("producer")
    consumer = cluster.pod("consumer")
    cluster.pod("third")
    cluster.kube.put_pod(pod_manifest("elsewhere", None, namespace="team-b"))
    cluster.kube.add_token(CAROL, "carol", [])
    cluster.kube.allow(
        AccessRule(user="carol", api_group="hotmount.io", resource="gpumounts",
                   verb="create", namespace="default", name="consumer")
    )  # fmt: skip
    agent = cluster.agent()
    node = f"/dev/nvidia{GPU0.minor}"
    with agent.client(ALICE) as api, agent.client(CAROL) as carol:
        assert mount(api, "producer", devices=["0"]).status_code == 200
        # Carol may mount into the consumer, but not into the producer she names.
        forbidden = mount(carol, "consumer", devices=["0"], shareWith="producer")
        assert forbidden.status_code == 403, forbidden.text
        assert node[5:] not in consumer.ls_dev()

        shared = mount(api, "consumer", devices=["0"], shareWith="producer")

        assert shared.status_code == 200, shared.text
        assert shared.json()["mounted"][0]["sharedWith"] == "producer"
        assert producer.open_result(node) == consumer.open_result(node) == "ENXIO"
        holders = devices(api)[GPU0.uuid]["holders"]
        assert sorted(h["pod"] for h in holders) == ["consumer", "producer"]
        status = api.get("/v1/namespaces/default/pods/consumer/devices").json()
        [device] = status["containers"][0]["devices"]
        assert [h["pod"] for h in device["otherHolders"]] == ["producer"]
        # Never further by accident: the third pod must name a current holder.
        assert mount(api, "third", devices=["0"]).status_code == 409
        assert mount(api, "third", devices=[GPU0.uuid], shareWith="nobody").status_code == 404
        # Another namespace cannot be named at all.
        other_ns = mount(api, "third", devices=["0"], shareWith="team-b/elsewhere")
        assert other_ns.status_code == 422
        assert mount(api, "third", devices=["0"], shareWith="consumer").status_code == 200


def test_sharing_with_the_pod_the_kubelet_gave_the_gpu(cluster: Cluster) -> None:
    cluster.pod("producer")
    cluster.pod("consumer")
    cluster.kubelets["node-a"].set_allocation(
        "default", "producer", "main", "nvidia.com/gpu", [GPU0.uuid]
    )
    agent = cluster.agent()
    with agent.client(ALICE) as api:
        assert mount(api, "consumer", devices=["0"]).status_code == 409
        shared = mount(api, "consumer", devices=["0"], shareWith="producer")
        assert shared.status_code == 200, shared.text
        holders = devices(api)[GPU0.uuid]["holders"]
        assert sorted((h["source"], h["pod"]) for h in holders) == [
            ("hotmount", "consumer"),
            ("kubelet", "producer"),
        ]
