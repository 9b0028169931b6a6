"""A suspension never stops the reconcile pass (issue 40): a real agent with the
stand-in driver, whose checkpoint or restore of each process waits at a gate the test
opens ($FAKE_CUDA_GATE_DIR), so a suspension is held part-way for as long as the test
likes: a tenant's suspend whose pin is deleted meanwhile, an idle suspension, and the
repair of a resume the agent crashed in.

While it is held, passes must go on finishing (`hotmount_reconciles_total` grows) and
/healthz must stay 200 for longer than its allowance: a pass that waited on the
suspension's container lock, or that ran the suspension's checkpoint itself, would stop
take-backs, double bookings, idle reclaim and remounts on the whole node, and get the
agent restarted by its liveness probe.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from hotmount.state.ledger import Ledger
from tests.agent.conftest import ALICE
from tests.agent.test_accounting import pins_of
from tests.agent.test_idle_reclaim import HUNG, passes
from tests.fakes import nvml as fake_nvml
from tests.fakes.kube_apiserver import AccessRule
from tests.fakes.nvml import FakeActivity
from tests.support.cuda_standin import UUID_A, UUID_B, StandIn, status
from tests.support.suspend_world import (  # noqa: F401 (fixtures)
    PODS,
    World,
    gates_fixture,
    standin_fixture,
)
from tests.support.waiting import wait_for

pytestmark = pytest.mark.kernel
# /healthz fails after max(reconcile interval (1 s) x 9, 3 x fs-deadline 3 s) = 9 s with
# no finished pass; a held suspension outlasts that while the test counts passes.
STALL = ("--reconcile-stall-intervals", "9", "--fs-deadline", "3")
ALLOWANCE_PASSES = 12  # passes are at least 1 s apart: 12 of them outlast the 9 s
PATIENCE = 45  # seconds for those passes; a stopped loop never gets there


def _health(world: World) -> int:
    with httpx.Client(base_url=world.agent.url, timeout=10) as probe:
        return probe.get("/healthz").status_code


def passes_go_on(world: World, what: str) -> None:
    """ALLOWANCE_PASSES more passes finish, and /healthz answers 200 at every look."""
    target = passes(world.agent) + ALLOWANCE_PASSES + 1  # one may be under way
    seen: list[int] = []

    def looked() -> bool:
        seen.append(_health(world))
        return passes(world.agent) >= target

    wait_for(
        looked,
        f"{ALLOWANCE_PASSES} reconcile passes while {what}",
        timeout=PATIENCE,
        show=lambda: {"passes": passes(world.agent), "healthz": sorted(set(seen))},
    )
    assert set(seen) == {200}, seen


def suspension_step(world: World, container_id: str) -> str | None:
    record = Ledger(world.cluster.workdir / "state-node-a").load(container_id)
    return record.suspension.step if record and record.suspension else None


def post(world: World, verb: str) -> Any:
    with world.agent.client(ALICE) as api:
        return api.post(f"{PODS}/nb/{verb}", json={})


@pytest.fixture(name="pinned")
def pinned_fixture(tmp_path: Path, standin: StandIn, gates: Path) -> Iterator[World]:
    """node-a's device plugin offers both GPUs (a mount by name is pinned); checkpoints
    wait at `gates`."""
    (tmp_path / "world").mkdir()
    made = World(
        tmp_path / "world",
        standin,
        gpus=[UUID_A, UUID_B],
        args=(*STALL, "--holder-orphan-grace", "0"),
        env_more={"FAKE_CUDA_GATE_DIR": str(gates)},
    )
    try:
        yield made
    finally:
        made.close()


def test_a_held_suspension_whose_pin_is_deleted_does_not_stop_reconcile(
    pinned: World, gates: Path
) -> None:
    """The tenant deletes its pin while its suspend waits at the checkpoint: reconcile
    wants the container's lock to take the GPU back, and the suspend holds it. The pass
    skips that container and finishes; the suspension goes on and takes the GPU."""
    container, pid = pinned.notebook()
    [pin] = [p["metadata"]["name"] for p in pins_of(pinned.cluster, "nb")]
    pinned.cluster.kube.allow(AccessRule(user="alice", resource="pods", namespace="default"))
    with ThreadPoolExecutor(1) as pool:
        posted = pool.submit(post, pinned, "suspend")
        wait_for(
            lambda: suspension_step(pinned, container.id) == "checkpointing",
            "the suspend to wait at its checkpoint",
            timeout=HUNG,
        )
        with pinned.cluster.api(ALICE) as kube:
            gone = kube.delete(f"/api/v1/namespaces/default/pods/{pin}")
            assert gone.status_code == 200, gone.text

        passes_go_on(pinned, "the suspend waits at its checkpoint, its pin deleted")
        assert not posted.done()
        (gates / f"checkpoint-{pid}").touch()
        done = posted.result(timeout=HUNG)
    assert done.status_code == 200, done.text
    assert status(container) == "checkpointed - pattern=ok"
    assert not pinned.cluster.events("GPUTakenBack")  # the suspension took it first
    assert _health(pinned) == 200


@pytest.fixture(name="idle")
def idle_fixture(tmp_path: Path, standin: StandIn, gates: Path) -> Iterator[World]:
    """Judged by NVML's utilization (GPU A busy until the test says otherwise);
    checkpoints wait at `gates`."""
    (tmp_path / "world").mkdir()
    activity = fake_nvml.write_activity(tmp_path / "activity", [FakeActivity(UUID_A, gpu=50)])
    made = World(
        tmp_path / "world",
        standin,
        args=(*STALL, "--use-nvml"),
        env_more=fake_nvml.with_activity({"FAKE_CUDA_GATE_DIR": str(gates)}, activity),
    )
    try:
        yield made
    finally:
        made.close()


def test_an_idle_suspension_runs_beside_the_reconcile_pass(
    idle: World, gates: Path, tmp_path: Path
) -> None:
    """The idle policy `suspend` checkpoints a process for as long as the driver takes
    (minutes for a large one): held at its checkpoint, passes still finish."""
    container, pid = idle.notebook(idleTimeout="3s", idlePolicy="suspend")
    fake_nvml.write_activity(tmp_path / "activity", [])  # idle from now on
    wait_for(
        lambda: suspension_step(idle, container.id) == "checkpointing",
        "the idle suspension to wait at its checkpoint",
        timeout=HUNG,
    )

    passes_go_on(idle, "the idle suspension waits at its checkpoint")
    assert not idle.cluster.events("GPUSuspended")
    (gates / f"checkpoint-{pid}").touch()
    wait_for(lambda: idle.cluster.events("GPUSuspended"), "the idle suspension", timeout=HUNG)
    assert status(container) == "checkpointed - pattern=ok"
    assert _health(idle) == 200


@pytest.fixture(name="held")
def held_fixture(tmp_path: Path, standin: StandIn, gates: Path) -> Iterator[World]:
    """Checkpoints and restores wait at `gates`."""
    (tmp_path / "world").mkdir()
    made = World(
        tmp_path / "world", standin, args=STALL, env_more={"FAKE_CUDA_GATE_DIR": str(gates)}
    )
    try:
        yield made
    finally:
        made.close()


def children_of_a_dead_agent(port: int) -> list[int]:
    """Processes forked by the agent that served `port` (they share its command line):
    after a crash, its CUDA call still waiting at a gate."""
    wanted = f"127.0.0.1:{port}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                argv = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"agent.main" in argv and wanted in argv:
                found.append(int(entry.name))
    return found


def test_the_repair_of_a_crashed_resume_runs_beside_the_reconcile_pass(
    held: World, gates: Path
) -> None:
    """The agent dies while a resume waits at its restore. The next agent finishes the
    restore (ten minutes per process at most), and its passes go on meanwhile."""
    container, pid = held.notebook()
    (gates / f"checkpoint-{pid}").touch()
    suspended = post(held, "suspend")
    assert suspended.status_code == 200, suspended.text
    resume = threading.Thread(target=lambda: _quietly(post, held, "resume"))
    resume.start()
    wait_for(
        lambda: suspension_step(held, container.id) == "restoring",
        "the resume to wait at its restore",
        timeout=HUNG,
    )
    held.agent.process.kill()
    held.agent.process.wait()
    for child in children_of_a_dead_agent(held.agent.port):  # its restore would race
        os.kill(child, signal.SIGKILL)  # the next agent's
    held.restart()
    resume.join(HUNG)

    passes_go_on(held, "the new agent's repair waits at the restore")
    assert suspension_step(held, container.id) == "restoring"
    (gates / f"restore-{pid}").touch()
    wait_for(
        lambda: suspension_step(held, container.id) is None,
        "the repair to finish the resume",
        timeout=HUNG,
    )
    assert status(container) == "running /dev/nvidia0 pattern=ok"
    assert _health(held) == 200


def _quietly(call: Any, *args: Any) -> Any:
    """A call whose connection the crash cuts: its error, not an exception."""
    try:
        return call(*args)
    except Exception as exc:
        return exc
