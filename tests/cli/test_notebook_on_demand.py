"""On-demand GPUs in a notebook (issue 42): a real IPython shell configured as inside pod
default/nb (annotated hotmount.io/gpu-on-demand, GPU_HOTMOUNT_ON_DEMAND=1), a real agent
with the stand-in driver, real runc containers. Each cell holds a GPU only while it runs;
a cell that finds none free waits in line and says so; Ctrl-C gives the place up."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from tests.agent.conftest import ALICE
from tests.agent.test_on_demand import ON_DEMAND, acquire, on_demand_world, release  # noqa: F401
from tests.cli.test_notebook_suspend import in_pod_fixture, shell_fixture  # noqa: F401 (fixtures)
from tests.cli.test_notebook_warnings import cell
from tests.support.cuda_standin import A, B, nvml_config, start_cuda, status
from tests.support.suspend_world import World, standin_fixture  # noqa: F401 (a fixture)
from tests.support.waiting import wait_for

pytestmark = pytest.mark.kernel
PODS = "/v1/namespaces/default/pods"


@pytest.fixture(autouse=True)
def on_demand_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    """The kernel of an on-demand pod (set before `shell` loads the extension)."""
    monkeypatch.setenv("GPU_HOTMOUNT_ON_DEMAND", "1")


def test_a_cell_waits_in_line_then_resumes_onto_the_gpu_freed(
    world: World, shell: object, capsys: pytest.CaptureFixture[str]
) -> None:
    container = world.cluster.pod("nb", annotations=ON_DEMAND)
    for other in ("left", "right"):
        world.cluster.pod(other, annotations=ON_DEMAND)
    assert cell(shell, capsys, "tensors = [1, 2, 3]") == ""  # its first GPU: A, quietly
    proc, pid = start_cuda(container)
    world.processes.append(proc)
    nvml_config(world.nvml_config, [pid])
    with world.agent.client(ALICE) as api:
        assert acquire(api, "left")["devices"] == [B]  # runs a cell from here on
        # nb's GPU is suspended for the waiter "right" (nb's cell ended: idle)
        assert acquire(api, "right", wait=15)["devices"] == [A]
    assert status(container) == "checkpointed - pattern=ok"

    def free_later() -> None:
        time.sleep(2)
        with world.agent.client(ALICE) as api:
            release(api, "left")

    freeing = threading.Thread(target=free_later)
    freeing.start()
    said = cell(shell, capsys, "assert tensors == [1, 2, 3]")  # the kernel's state kept
    freeing.join()
    lines = said.splitlines()
    assert lines[0].startswith("%gpu: waiting for a GPU: 1st in line"), said
    assert lines[-1].startswith(f"%gpu: resumed {A} onto {B} after "), said
    assert status(container) == "running /dev/nvidia1 pattern=ok"
    with world.agent.client(ALICE) as api:
        assert api.get("/v1/devices").json()["queue"] == []


def test_ctrl_c_while_waiting_gives_the_place_up(
    world: World, shell: object, capsys: pytest.CaptureFixture[str]
) -> None:
    """The notebook's interrupt is SIGINT to the kernel: the place is given up at once,
    and the cell (which IPython runs whatever a hook raises) is told it has no GPU."""
    world.cluster.pod("nb", annotations=ON_DEMAND)
    for other in ("left", "right"):
        world.cluster.pod(other, annotations=ON_DEMAND)
    with world.agent.client(ALICE) as api:
        assert acquire(api, "left")["devices"] and acquire(api, "right")["devices"]

        def interrupt() -> None:
            wait_for(lambda: api.get("/v1/devices").json()["queue"], "nb in line")
            time.sleep(1.5)  # in the second, long poll
            os.kill(os.getpid(), signal.SIGINT)

        threading.Thread(target=interrupt).start()
        said = cell(shell, capsys, "ran = True")
        assert api.get("/v1/devices").json()["queue"] == [], said
    assert said.splitlines() == [
        "%gpu: waiting for a GPU: 1st in line",
        "%gpu: stopped waiting for a GPU; the place in line is given up and this cell runs "
        "without one (interrupt it again to stop it)",
    ], said
