"""Suspend and resume (issue 33) on real runc containers, with the stand-in driver.

Two stand-in GPUs of one model with real drivers (tests/support/cuda_standin.py). The fake NVML
(tests/fakes/nvml) reports them and the stand-in process's GPU memory (512 MiB), the
stand-in libcuda (tests/fakes/driver/libcuda.c) under a driver root speaks to the
stand-in CUDA process (cuda_process.c) in the container, which keeps a known pattern
in its "GPU memory", closes its GPU files on a checkpoint, and on a restore opens the
node of the GPU it is given and checks the pattern.

The engine runs in a process of its own (tests/support/suspend_runner.py): NVML is
loaded by soname with the environment a process starts with, and a crash is real.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from hotmount.engine.core import Engine, EngineConfig
from hotmount.state.ledger import ContainerRecord
from hotmount.suspend.memory import memory_cgroup
from tests.fakes import nvml
from tests.support.cuda_standin import (
    GPU_MAP,
    MODEL,
    UUID_A,
    UUID_B,
    A,
    B,
    StandIn,
    build_standin,
    container_pid,
    gpu_fds,
    nvml_config,
    start_cuda,
    status,
)
from tests.support.runc import RuncContainer


@pytest.fixture(scope="module")
def standin(tmp_path_factory: pytest.TempPathFactory) -> StandIn:
    return build_standin(tmp_path_factory.mktemp("suspend"))


class Node:
    """One node's engine state, the fake driver's, and the containers on it."""

    def __init__(self, tmp: Path, standin: StandIn) -> None:
        self.tmp, self.standin = tmp, standin
        self.state_dir = tmp / "state"
        self.cuda_state = tmp / "cuda-state"
        self.cuda_state.mkdir()
        self.nvml_config = tmp / "nvml.conf"
        self.containers: list[RuncContainer] = []
        self.processes: list[subprocess.Popen[bytes]] = []
        self.cuda_pids: list[int] = []
        self.driver_version = 13000
        self.write_nvml()

    def engine(self) -> Engine:
        root = str(self.standin.driver_root)
        cdi = (str(self.standin.cdi_dir),)
        return Engine(EngineConfig(cdi_dirs=cdi, state_dir=self.state_dir, use_nvml=False,
                                   stop_grace=2, driver_root=root))  # fmt: skip

    def container(self, mode: str = "v1") -> RuncContainer:
        made = RuncContainer(self.tmp, self.standin.rootfs, mode)
        self.containers.append(made)
        return made

    def start_cuda(
        self, container: RuncContainer, *extra: str, status: str = "a", gpus: list[str] = GPU_MAP
    ) -> int:
        """The stand-in CUDA process on GPU A; its host PID (NVML lists it on A)."""
        proc, pid = start_cuda(container, *extra, status=status, gpus=gpus)
        self.processes.append(proc)
        self.cuda_pids.append(pid)
        self.write_nvml()
        return pid

    def write_nvml(self) -> None:
        nvml_config(self.nvml_config, self.cuda_pids)

    def run(self, op: str, container: RuncContainer | None = None, **options: object) -> dict:
        config = {"op": op, "container": container.id if container else None,
                  "cdi_dir": str(self.standin.cdi_dir), "state_dir": str(self.state_dir),
                  "driver_root": str(self.standin.driver_root), **options}  # fmt: skip
        path = self.tmp / "runner.json"
        path.write_text(json.dumps(config))
        env = nvml.env(self.standin.nvml_dir, self.nvml_config)
        env |= {"FAKE_CUDA_STATE_DIR": str(self.cuda_state),
                "FAKE_CUDA_DRIVER_VERSION": str(self.driver_version)}  # fmt: skip
        done = subprocess.run(
            [sys.executable, "-m", "tests.support.suspend_runner", str(path)],
            capture_output=True, text=True, timeout=120, env=env, check=False,
            cwd=Path(__file__).parents[2],
        )  # fmt: skip
        if done.returncode == -9:
            return {"crashed": True}
        assert done.stdout, done.stderr
        return json.loads(done.stdout.splitlines()[-1])

    def close(self) -> None:
        for proc in self.processes:
            proc.kill()
            proc.communicate()
        for container in self.containers:
            container.stop()
        shutil.rmtree(self.cuda_state, ignore_errors=True)


@pytest.fixture
def node(tmp_path: Path, standin: StandIn) -> Iterator[Node]:
    made = Node(tmp_path, standin)
    yield made
    made.close()


Setup = Callable[..., tuple[RuncContainer, int]]


@pytest.fixture
def pod(node: Node) -> Setup:
    def make(mode: str = "v1", *extra: str) -> tuple[RuncContainer, int]:
        container = node.container(mode)
        node.engine().mount(container.id, [A])
        return container, node.start_cuda(container, *extra)

    return make


def record(node: Node, container: RuncContainer) -> ContainerRecord:
    return node.engine().ledger.load(container.id)


@pytest.mark.parametrize("mode", ["v1", "v2"])
def test_suspend_then_resume_onto_the_same_gpu(node: Node, pod: Setup, mode: str) -> None:
    container, pid = pod(mode)
    assert gpu_fds(pid) == ["/dev/nvidia0", "/dev/nvidiactl"]

    done = node.run("suspend", container)
    assert done["ok"]["suspended"] == [A], done
    # the host PID for the node (the agent), and the one the container sees (tenants)
    expected = {"pid": pid, "containerPid": container_pid(pid), "gpuBytes": 512 << 20}
    assert done["ok"]["processes"] == [expected]
    assert status(container) == "checkpointed - pattern=ok"
    assert gpu_fds(pid) == []  # alive, holding no GPU
    assert container.open_result("/dev/nvidia0") == "ENOENT"  # the GPU left the container
    engine = node.engine()
    assert A not in engine.holders()  # its claim released: the GPU is the node's again
    saved = engine.ledger.load(container.id)
    assert list(saved.suspended) == [A] and saved.suspension is None
    assert [(p.pid, p.container_pid) for p in saved.suspended_processes] == [
        (pid, container_pid(pid))
    ]

    back = node.run("resume", container)
    assert back["ok"]["resumed"] == {A: A}, back
    assert status(container) == "running /dev/nvidia0 pattern=ok"
    assert gpu_fds(pid) == ["/dev/nvidia0", "/dev/nvidiactl"]
    saved = node.engine().ledger.load(container.id)
    assert not saved.suspended and A in saved.devices


def test_resume_onto_another_gpu_of_the_model(node: Node, pod: Setup) -> None:
    container, pid = pod()
    assert "ok" in node.run("suspend", container)
    other = node.container()
    node.engine().mount(other.id, [A])  # another pod got the GPU meanwhile

    back = node.run("resume", container)
    assert "ok" in back, back
    assert back["ok"]["resumed"] == {A: B}, back
    assert status(container) == "running /dev/nvidia1 pattern=ok"
    assert gpu_fds(pid) == ["/dev/nvidia1", "/dev/nvidiactl"]
    assert container.open_result("/dev/nvidia0") == "ENOENT"


def test_labels_the_caller_releases_on_suspend_are_not_carried_onto_the_resumed_gpu(
    node: Node,
) -> None:
    """The agent deletes a mount's pin on suspend; a resume onto another GPU must not name
    it again. The engine does not know what a pin is: it drops the labels it is told to
    (EngineConfig.released_on_suspend) and keeps every other."""
    container = node.container()
    labels = {"holder": "pin-a", "holderUid": "uid-a", "team": "ml"}
    node.engine().mount(container.id, [A], device_metadata={A: labels})
    node.start_cuda(container)
    assert "ok" in node.run("suspend", container)
    assert record(node, container).suspended[A].device.metadata == labels
    node.engine().mount(node.container().id, [A])  # the GPU went to another pod meanwhile

    back = node.run("resume", container, released_on_suspend=["holder", "holderUid"])
    assert back["ok"]["resumed"] == {A: B}, back
    assert record(node, container).devices[B].metadata == {"team": "ml"}


def test_resume_with_no_gpu_free_keeps_the_suspension(node: Node, pod: Setup) -> None:
    container, _ = pod()
    assert "ok" in node.run("suspend", container)
    other = node.container()
    node.engine().mount(other.id, [A, B])

    back = node.run("resume", container)
    assert back["error"] == "NoGpuFree" and back["status"] == 409, back
    assert back["message"] == f"no GPU of model {MODEL} is free on this node"
    assert status(container) == "checkpointed - pattern=ok"
    saved = record(node, container)
    assert list(saved.suspended) == [A] and saved.suspension is None and not saved.devices


def test_memory_refusal_changes_nothing(node: Node, pod: Setup) -> None:
    container, pid = pod("v1")
    found = memory_cgroup(Path(f"/proc/{pid}/cgroup").read_text())
    assert found is not None and found[0] == "v1", found
    cgroup = Path("/sys/fs/cgroup/memory") / found[1].lstrip("/")
    usage = int((cgroup / "memory.usage_in_bytes").read_text())
    (cgroup / "memory.limit_in_bytes").write_text(str(usage + (100 << 20)))

    done = node.run("suspend", container)
    assert done["error"] == "InsufficientMemory" and done["status"] == 409, done
    assert "needs 512 MiB of host memory" in done["message"]
    assert "MiB free: " in done["message"] and "MiB missing" in done["message"]
    assert status(container) == "running /dev/nvidia0 pattern=ok"
    assert gpu_fds(pid) == ["/dev/nvidia0", "/dev/nvidiactl"]
    saved = record(node, container)
    assert A in saved.devices and not saved.suspended and saved.suspension is None


def test_a_process_that_will_not_lock_unlocks_the_others(node: Node, pod: Setup) -> None:
    container, first = pod()
    stuck = node.start_cuda(container, "--refuse-lock", status="b")
    assert first < stuck  # locked in PID order: the first one locks, then the wait runs out

    done = node.run("suspend", container, lock_timeout=1)
    assert done["error"] == "ProcessWontLock", done
    assert f"PID {stuck} did not lock within 1s" in done["message"]
    assert ["locked", {"pid": first}] in done["events"]
    assert status(container, "a") == "running /dev/nvidia0 pattern=ok"  # unlocked again
    assert status(container, "b") == "running /dev/nvidia0 pattern=ok"
    saved = record(node, container)
    assert A in saved.devices and not saved.suspended and saved.suspension is None


def test_a_driver_older_than_550_is_refused(node: Node, pod: Setup) -> None:
    container, _ = pod()
    node.driver_version = 12020  # driver 535: CUDA 12.2
    done = node.run("suspend", container)
    assert done["error"] == "CheckpointUnsupported", done
    assert "driver 550" in done["message"] and "CUDA 12.2" in done["message"]
    assert status(container) == "running /dev/nvidia0 pattern=ok"
    assert A in record(node, container).devices


def test_another_gpu_needs_driver_580(node: Node, pod: Setup) -> None:
    container, _ = pod()
    node.driver_version = 12080  # driver 570: checkpoints, restores onto the same GPU only
    assert "ok" in node.run("suspend", container)
    other = node.container()
    node.engine().mount(other.id, [A])

    back = node.run("resume", container)
    assert back["error"] == "CheckpointUnsupported", back
    assert "driver 580" in back["message"] and f"{UUID_A} -> {UUID_B}" in back["message"]
    assert status(container) == "checkpointed - pattern=ok"
    assert container.open_result("/dev/nvidia1") == "ENOENT"  # B was never mounted
    assert list(record(node, container).suspended) == [A]


def test_a_failed_restore_leaves_the_process_suspended(node: Node, pod: Setup) -> None:
    container = node.container()
    node.engine().mount(container.id, [A])
    # The process knows GPU A only: a restore onto B fails in the driver.
    pid = node.start_cuda(container, gpus=["--gpu", f"{UUID_A}=/dev/nvidia0"])
    assert "ok" in node.run("suspend", container)
    other = node.container()
    node.engine().mount(other.id, [A])

    back = node.run("resume", container)
    assert back["error"] == "RestoreFailed", back
    assert f"restoring PID {pid} failed" in back["message"]
    assert "CUDA_ERROR_INVALID_DEVICE" in back["message"]
    assert status(container) == "checkpointed - pattern=ok"
    assert container.open_result("/dev/nvidia1") == "ENOENT"  # B unmounted again
    saved = record(node, container)
    assert list(saved.suspended) == [A] and not saved.devices and saved.suspension is None


# A crash (SIGKILL) after each step a suspend records, then reconcile: before the unmount
# the suspension is rolled back (running on its GPU), from the unmount on it is finished
# (checkpointed, the GPU gone). Never a process left locked.
SUSPEND_CRASHES = {
    "locking": "rolled back",
    "locked": "rolled back",
    "checkpointing": "rolled back",
    "checkpointed": "rolled back",
    "unmounting": "finished",
    "unmounted": "finished",
}


@pytest.mark.parametrize("step", list(SUSPEND_CRASHES))
def test_a_crash_during_suspend_is_repaired_by_reconcile(node: Node, pod: Setup, step: str) -> None:
    container, pid = pod()
    assert node.run("suspend", container, crash_at=[step, 1]) == {"crashed": True}
    assert record(node, container).suspension is not None  # the crash left it part-way

    repaired = node.run("reconcile")
    assert repaired["ok"]["errors"] == {}, repaired
    saved = record(node, container)
    assert saved.suspension is None
    if SUSPEND_CRASHES[step] == "rolled back":
        assert status(container) == "running /dev/nvidia0 pattern=ok"
        assert A in saved.devices and not saved.suspended
        assert gpu_fds(pid) == ["/dev/nvidia0", "/dev/nvidiactl"]
    else:
        assert status(container) == "checkpointed - pattern=ok"
        assert list(saved.suspended) == [A] and not saved.devices
        assert container.open_result("/dev/nvidia0") == "ENOENT"
        back = node.run("resume", container)
        assert back["ok"]["resumed"] == {A: A}, back
        assert status(container) == "running /dev/nvidia0 pattern=ok"


# A resume: before its restores it is rolled back (still suspended, no GPU mounted); from
# the restores on it is finished (running on the GPU it was moving to).
RESUME_CRASHES = {
    "mounting": "rolled back",
    "mounted": "rolled back",
    "restoring": "finished",
    "restored": "finished",
}


@pytest.mark.parametrize("step", list(RESUME_CRASHES))
def test_a_crash_during_resume_is_repaired_by_reconcile(node: Node, pod: Setup, step: str) -> None:
    container, pid = pod()
    assert "ok" in node.run("suspend", container)
    other = node.container()
    node.engine().mount(other.id, [A])  # so the resume moves to B
    assert node.run("resume", container, crash_at=[step, 1]) == {"crashed": True}

    repaired = node.run("reconcile")
    assert repaired["ok"]["errors"] == {}, repaired
    saved = record(node, container)
    assert saved.suspension is None
    if RESUME_CRASHES[step] == "rolled back":
        assert status(container) == "checkpointed - pattern=ok"
        assert list(saved.suspended) == [A] and not saved.devices
        assert container.open_result("/dev/nvidia1") == "ENOENT"
    else:
        assert status(container) == "running /dev/nvidia1 pattern=ok"
        assert B in saved.devices and not saved.suspended
        assert gpu_fds(pid) == ["/dev/nvidia1", "/dev/nvidiactl"]


def test_a_node_still_held_after_the_checkpoint_rolls_back(node: Node, pod: Setup) -> None:
    """The process's own second fd on the GPU's node survives its checkpoint: nothing is
    unmounted, the process is restored and unlocked."""
    container, pid = pod("v1", "--keep-open")
    done = node.run("suspend", container)
    assert done["error"] == "DeviceBusy" and done["status"] == 409, done
    assert f"PID {pid} (cuda_process) holds /dev/nvidia0" in done["message"]
    assert status(container) == "running /dev/nvidia0 pattern=ok"
    saved = record(node, container)
    assert A in saved.devices and not saved.suspended and saved.suspension is None


def test_suspend_twice_and_resume_unsuspended_are_refused(node: Node, pod: Setup) -> None:
    container, _ = pod()
    never = node.run("resume", container)
    assert never["error"] == "NotSuspended" and never["status"] == 409, never
    assert "ok" in node.run("suspend", container)
    again = node.run("suspend", container)
    assert again["error"] == "AlreadySuspended", again
    assert status(container) == "checkpointed - pattern=ok"
