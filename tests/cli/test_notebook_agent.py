"""`%gpu` against a real agent process (fake API server, real runc pods), configured the
way it is inside a pod: a ServiceAccount directory (token, namespace), HOSTNAME, and
the agent's address from GPU_HOTMOUNT_AGENT (here plain HTTP on localhost)."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from cli import notebook
from cli.notebook import Config
from tests.agent.conftest import ALICE, BOB, DANA
from tests.agent.conftest import Cluster as RealCluster
from tests.fakes.agent_peers import refused_port
from tests.support.agent import GPUS, agent_pod_manifest

pytestmark = pytest.mark.kernel


def in_pod(real: RealCluster, tmp_path: Path, token: str, pod: str = "nb") -> Config:
    """The configuration `%gpu` finds in pod `pod` of `default` whose token is `token`."""
    sa = tmp_path / f"sa-{token}-{pod}"
    sa.mkdir(exist_ok=True)
    (sa / "token").write_text(token)
    (sa / "namespace").write_text("default")
    agent = real.agents[0]  # the pod's own node's agent (node-a)
    return Config.from_env({"HOSTNAME": pod, "GPU_HOTMOUNT_AGENT": agent.url}, sa)


def gpu(line: str, config: Config) -> tuple[bool, str, str]:
    out, err = io.StringIO(), io.StringIO()
    ok = notebook.magic(line, config, out, err)
    return ok, out.getvalue().strip(), err.getvalue().strip()


def test_attach_status_detach_from_inside_the_pod(real: RealCluster, tmp_path: Path) -> None:
    container = real.pod("nb")
    real.agent()
    config = in_pod(real, tmp_path, DANA)  # a RoleBinding to hotmount-user, nothing more

    ok, out, err = gpu("attach --idle 1h", config)
    assert ok, err
    assert out.startswith("attached GPU ") and "to default/nb (main)" in out
    assert "given back after 1h unused" in out
    assert "CUDA finds it on first use" in out  # nothing here initialised CUDA
    [mounted] = notebook.status(config).containers[0].devices
    assert mounted.uuid in {g.uuid for g in GPUS}
    minor = next(g.minor for g in GPUS if g.uuid == mounted.uuid)
    assert container.open_result(f"/dev/nvidia{minor}") == "ENXIO"  # granted, no driver

    ok, out, err = gpu("status", config)
    assert ok and f"({mounted.key}) in main:" in out and "given back after 1h idle" in out

    ok, out, err = gpu("detach", config)
    assert ok and out == f"detached {mounted.key} (its scheduler slot is released)"
    assert notebook.status(config).containers == []
    assert sorted(real.kube.free_devices("node-a")) == sorted(g.uuid for g in GPUS)


def test_refusals_are_one_line(real: RealCluster, tmp_path: Path) -> None:
    real.pod("nb")
    real.pod("other")
    agent = real.agent()
    with agent.client(ALICE) as api:
        taken = api.post("/v1/namespaces/default/pods/other/devices", json={"devices": ["0"]})
        assert taken.status_code == 200, taken.text

    ok, _, err = gpu("attach 0", in_pod(real, tmp_path, DANA))
    assert not ok
    assert err.startswith("%gpu: that GPU is in use elsewhere") and "default/other" in err

    ok, _, err = gpu("attach", in_pod(real, tmp_path, BOB))
    assert not ok
    assert err.startswith("%gpu: no permission: this pod's ServiceAccount may not attach")

    ok, _, err = gpu("list", in_pod(real, tmp_path, DANA))  # nodedevices: cluster-scoped
    assert not ok and "hotmount-viewer" in err

    ok, _, err = gpu("attach --count 3", in_pod(real, tmp_path, DANA))
    assert not ok and err.startswith("%gpu: no free GPU on this node right now")

    ok, _, err = gpu("attach 7", in_pod(real, tmp_path, DANA))
    assert not ok and err.startswith("%gpu: ") and "\n" not in err

    ok, out, _ = gpu("list", in_pod(real, tmp_path, ALICE))  # may list nodedevices
    assert ok and out.startswith(f"free on node-a: GPU 1 ({GPUS[1].uuid})")
    assert f"GPU 0 ({GPUS[0].uuid})" not in out  # other's


def test_a_gpu_a_process_holds_is_not_detached(real: RealCluster, tmp_path: Path) -> None:
    container = real.pod("nb")
    real.agent()
    config = in_pod(real, tmp_path, DANA)
    assert notebook.attach(["nvidia.com/gpu=1"], config=config).mounted
    holder = container.hold("/dev/nvidia1")
    try:
        ok, _, err = gpu("detach nvidia.com/gpu=1", config)
    finally:
        holder.kill()
        holder.communicate()
    assert not ok and "is in use in this pod by PID" in err and "restart the kernel" in err


def test_gpu_list_shows_every_node_and_names_the_one_that_did_not_answer(
    real: RealCluster, tmp_path: Path
) -> None:
    """The notebook's own node's agent asks the others for it (issue 20): node-b's GPUs
    are listed too, and a node whose agent refuses is named, not silently left out."""
    real.pod("nb")
    real.pod("other")
    # node-refused fails at once (connection refused): no short timeout is needed, and a
    # short one lost node-b's answer on a loaded machine (a cold CI run, load 9).
    node_a = real.agent("node-a", extra=["--list-timeout", "20"])
    real.agent("node-b")
    real.kube.put_pod(agent_pod_manifest("node-refused", refused_port()))
    with node_a.client(ALICE) as api:
        taken = api.post("/v1/namespaces/default/pods/other/devices", json={"devices": ["0"]})
        assert taken.status_code == 200, taken.text

    ok, out, err = gpu("list", in_pod(real, tmp_path, ALICE))  # may list nodedevices
    assert ok, err
    lines = out.splitlines()
    [on_a] = [line for line in lines if line.startswith("free on node-a: ")]
    [on_b] = [line for line in lines if line.startswith("free on node-b: ")]
    assert f"GPU 0 ({GPUS[0].uuid})" not in on_a  # other's, on node-a
    assert f"GPU 0 ({GPUS[0].uuid})" in on_b  # node-b's books are its own
    assert "node-refused: did not answer (Refused)" in lines
