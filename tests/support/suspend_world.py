"""A fake cluster (tests/agent/conftest.py's) whose agent has the stand-in CUDA driver
(tests/support/cuda_standin.py): for suspend and resume over HTTP and through nvcli."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.agent.conftest import ALICE, AggregatedAgent, Cluster
from tests.fakes import nvml
from tests.support.agent import AgentProcess
from tests.support.cuda_standin import A, StandIn, build_standin, nvml_config, start_cuda
from tests.support.runc import RuncContainer

PODS = "/v1/namespaces/default/pods"


class World:
    def __init__(
        self,
        tmp: Path,
        standin: StandIn,
        *,
        args: tuple[str, ...] = (),
        env_more: dict[str, str] | None = None,
        gpus: list[str] | None = None,
    ) -> None:
        """`args`, `env_more`: more agent flags, and environment over the stand-ins'; `gpus`:
        the GPUs node-a's device plugin advertises (default none of the stand-in's, so
        they need no pin)."""
        self.cluster = Cluster(tmp, standin.rootfs, standin.cdi_dir, gpus=gpus)
        self.nvml_config = nvml_config(tmp / "nvml.conf", [])
        cuda_state = tmp / "cuda-state"
        cuda_state.mkdir()
        env = nvml.env(standin.nvml_dir, self.nvml_config, base={})
        env |= {"FAKE_CUDA_STATE_DIR": str(cuda_state), "FAKE_CUDA_DRIVER_VERSION": "13000"}
        self._extra = ["--driver-root", str(standin.driver_root), *args]
        self._env = env | (env_more or {})
        self.agent: AgentProcess = self.cluster.agent(extra=self._extra, env=self._env)
        self.processes: list[subprocess.Popen[bytes]] = []
        self.agent_args = args

    def notebook(self, name: str = "nb", **mount: object) -> tuple[RuncContainer, int]:
        """A pod with GPU A hot-mounted (`mount`: more of the request) and a CUDA
        process on it."""
        container = self.cluster.pod(name)
        with self.agent.client(ALICE) as api:
            mounted = api.post(f"{PODS}/{name}/devices", json={"devices": [A], **mount})
        assert mounted.status_code == 200, mounted.text
        proc, pid = start_cuda(container)
        self.processes.append(proc)
        nvml_config(self.nvml_config, [pid])
        return container, pid

    def crash_and_restart(self) -> None:
        """SIGKILL the agent wherever it is, then start another on the same state."""
        self.agent.process.kill()
        self.agent.process.wait()
        self.restart()

    def restart(self) -> None:
        """Another agent on the same state (the last one stopped or killed)."""
        self.agent = self.cluster.agent(extra=self._extra, env=self._env)

    def behind_the_api_server(self) -> AggregatedAgent:
        """The agent stopped, and another started on the same state as the API server's
        `hotmount.io` backend (the aggregated API: calls through `cluster.api(token)`)."""
        self.agent.stop()
        backend = self.cluster.aggregated_agent(extra=self._extra, env=self._env)
        self.agent = backend.agent
        return backend

    def second_process(self, container: RuncContainer, first: int) -> list[int]:
        """Another CUDA process in the notebook's container, on GPU A too (512 MiB each
        in NVML); both host PIDs in the order the engine takes them (sorted)."""
        proc, second = start_cuda(container, status="b")
        self.processes.append(proc)
        nvml_config(self.nvml_config, [first, second])
        return sorted([first, second])

    def close(self) -> None:
        for proc in self.processes:
            proc.kill()
            proc.communicate()
        self.cluster.close()


# Fixtures a suspend test module imports (`standin_fixture`, `world_fixture`); pytest
# knows them by their names, `standin` and `world`.
@pytest.fixture(scope="module", name="standin")
def standin_fixture(tmp_path_factory: pytest.TempPathFactory) -> StandIn:
    """The stand-in driver, libcuda and CUDA process, built once a module."""
    return build_standin(tmp_path_factory.mktemp("suspend"))


@pytest.fixture(name="world")
def world_fixture(tmp_path: Path, standin: StandIn) -> Iterator[World]:
    made = World(tmp_path, standin)
    try:
        yield made
    finally:
        made.close()


@pytest.fixture(name="gates")
def gates_fixture(tmp_path: Path) -> Path:
    """$FAKE_CUDA_GATE_DIR of `gated` (tests/fakes/driver/libcuda.c): a checkpoint or
    restore of PID P waits until the test makes `checkpoint-P` or `restore-P` here."""
    made = tmp_path / "gates"
    made.mkdir()
    return made


@pytest.fixture(name="gated")
def gated_fixture(tmp_path: Path, standin: StandIn, gates: Path) -> Iterator[World]:
    """A world whose checkpoints and restores wait at `gates`."""
    (tmp_path / "world").mkdir()
    made = World(tmp_path / "world", standin, env_more={"FAKE_CUDA_GATE_DIR": str(gates)})
    try:
        yield made
    finally:
        made.close()
