"""`nvcli suspend` and `nvcli resume` against a real agent with the stand-in CUDA driver
(tests/support/suspend_world.py): what a user types, what comes back, the exit codes."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from hotmount.wire.schemas import MAX_LOCK_TIMEOUT
from tests.agent.conftest import ALICE, DANA
from tests.cli.conftest import Run
from tests.support.cuda_standin import MODEL, A, B, container_pid, status
from tests.support.suspend_world import PODS, World, standin_fixture, world_fixture  # noqa: F401 (fixtures)

pytestmark = pytest.mark.kernel


def test_suspend_then_resume(world: World, nvcli: Callable[..., Run]) -> None:
    container, pid = world.notebook()
    flags = ["--agent", world.agent.url, "--token", ALICE, "-n", "default"]

    done = nvcli("suspend", "--name", "nb", *flags)
    assert done.rc == 0, done.err
    assert done.out.strip() == (
        f"suspended {A} of nb/main: 1 processes kept, 512 MiB of GPU memory in host memory"
    )
    assert status(container) == "checkpointed - pattern=ok"
    listed = nvcli("status", "--name", "nb", *flags)
    assert listed.rc == 0, listed.err
    [header, row] = listed.out.splitlines()  # no idle note: nothing is warned
    assert header.split()[-1] == "STATE" and row.split()[-1] == "suspended"

    back = nvcli("resume", "--name", "nb", "-o", "json", *flags)
    assert back.rc == 0, back.err
    assert back.json()["resumed"] == {A: A} and back.err == ""  # quiet: JSON alone
    # the PID the container sees, never the host's
    assert back.json()["processes"] == [{"pid": container_pid(pid), "gpuBytes": 512 << 20}]
    assert status(container) == "running /dev/nvidia0 pattern=ok"


def test_no_gpu_free_exits_3_and_says_so(world: World, nvcli: Callable[..., Run]) -> None:
    world.notebook()
    world.cluster.pod("other")
    flags = ["--agent", world.agent.url, "--token", ALICE, "-n", "default"]
    assert nvcli("suspend", "--name", "nb", *flags).rc == 0
    with world.agent.client(ALICE) as api:
        taken = api.post(f"{PODS}/other/devices", json={"devices": [A, B]})
    assert taken.status_code == 200, taken.text

    refused = nvcli("resume", "--name", "nb", *flags)
    assert refused.rc == 3, refused.err
    assert f"no GPU of model {MODEL} is free on this node" in refused.err


def test_a_held_gpu_without_force_exits_5_and_names_the_role(
    world: World, nvcli: Callable[..., Run]
) -> None:
    container, _ = world.notebook()
    flags = ["--agent", world.agent.url, "--token", DANA, "-n", "default"]
    refused = nvcli("suspend", "--name", "nb", *flags)
    assert refused.rc == 5, refused.err
    assert "ask for force on gpumounts.hotmount.io in namespace default" in refused.err
    assert status(container) == "running /dev/nvidia0 pattern=ok"


def test_suspend_needs_a_pod(nvcli: Callable[..., Run]) -> None:
    done = nvcli("suspend", "--agent", "http://127.0.0.1:9", "--token", "t")
    assert done.rc == 2 and "Missing option '--name'" in done.err


def test_a_lock_timeout_over_the_agents_cap_is_refused_before_any_call(
    nvcli: Callable[..., Run],
) -> None:
    """`--lock-timeout` has the agent's own cap (hotmount/wire/schemas.py MAX_LOCK_TIMEOUT): a
    larger one is a usage error (exit 2) that names it, and no agent is asked."""
    assert MAX_LOCK_TIMEOUT == 30
    flags = ["--agent", "http://127.0.0.1:9", "--token", ALICE, "-n", "default"]
    refused = nvcli("suspend", "--name", "nb", "--lock-timeout", "31", *flags)
    assert refused.rc == 2, (refused.out, refused.err)
    assert "--lock-timeout" in refused.err and "30" in refused.err
