"""The progress of a suspend and a resume (issue 33), read with GET on the same path
while the POST runs: a real agent with the stand-in driver, whose checkpoint and restore
of each process wait at a gate the test opens ($FAKE_CUDA_GATE_DIR), so each count is
read part-way without timing anything."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from tests.agent.conftest import ALICE, BOB
from tests.support.cuda_standin import A, status
from tests.support.suspend_world import (  # noqa: F401 (fixtures)
    PODS,
    World,
    gated_fixture,
    gates_fixture,
    standin_fixture,
)
from tests.support.waiting import wait_for

pytestmark = pytest.mark.kernel
MIB = 1 << 20


def progress(world: World, verb: str, token: str = ALICE) -> dict[str, Any]:
    with world.agent.client(token) as api:
        answer = api.get(f"{PODS}/nb/{verb}")
    assert answer.status_code == 200, answer.text
    return answer.json()


def post(world: World, verb: str) -> Any:
    with world.agent.client(ALICE) as api:
        return api.post(f"{PODS}/nb/{verb}", json={})


def test_suspend_and_resume_progress_grow_step_by_step(gated: World, gates: Path) -> None:
    container, pid = gated.notebook()
    first, second = gated.second_process(container, pid)
    assert progress(gated, "suspend") == {
        "namespace": "default", "pod": "nb", "op": "suspend", "running": False,
        "container": None, "step": None, "processes": None, "gpuBytes": None, "locked": 0,
        "checkpointed": 0, "restored": 0, "movedBytes": 0, "elapsedSeconds": None,
    }  # fmt: skip
    with ThreadPoolExecutor(1) as pool:
        posted = pool.submit(post, gated, "suspend")
        seen = wait_for(
            lambda: (p := progress(gated, "suspend"))["step"] == "checkpointing" and p,
            "the suspend to lock both processes and wait at the first checkpoint",
        )
        assert (seen["running"], seen["container"], seen["processes"]) == (True, "main", 2)
        assert (seen["locked"], seen["checkpointed"]) == (2, 0)
        assert (seen["gpuBytes"], seen["movedBytes"]) == (1024 * MIB, 0)

        (gates / f"checkpoint-{first}").touch()
        seen = wait_for(
            lambda: (p := progress(gated, "suspend"))["checkpointed"] == 1 and p,
            "the first process checkpointed",
        )
        assert seen["movedBytes"] == 512 * MIB and seen["step"] == "checkpointing"
        assert not posted.done()  # the second still waits at its gate

        (gates / f"checkpoint-{second}").touch()
        done = posted.result(timeout=60)
    assert done.status_code == 200, done.text
    assert done.json()["hostBytes"] == 1024 * MIB
    assert progress(gated, "suspend")["running"] is False

    with ThreadPoolExecutor(1) as pool:
        posted = pool.submit(post, gated, "resume")
        seen = wait_for(
            lambda: (p := progress(gated, "resume"))["step"] == "restoring" and p,
            "the resume to mount the GPU and wait at the first restore",
        )
        assert (seen["processes"], seen["restored"], seen["movedBytes"]) == (2, 0, 0)
        assert progress(gated, "suspend")["running"] is False  # the other op's path

        (gates / f"restore-{first}").touch()
        seen = wait_for(
            lambda: (p := progress(gated, "resume"))["restored"] == 1 and p,
            "the first process restored",
        )
        assert seen["movedBytes"] == 512 * MIB
        (gates / f"restore-{second}").touch()
        done = posted.result(timeout=60)
    assert done.status_code == 200, done.text
    assert done.json()["resumed"] == {A: A}
    assert progress(gated, "resume")["running"] is False


def test_progress_needs_the_verb_of_the_operation(gated: World, gates: Path) -> None:
    """bob may not suspend nb, so he may not watch its suspension: 403 while it runs, as
    before and after; the verb asked is the suspend's own (delete), the resume's (create)."""
    container, pid = gated.notebook()
    first, second = gated.second_process(container, pid)
    with ThreadPoolExecutor(1) as pool:
        posted = pool.submit(post, gated, "suspend")
        wait_for(lambda: progress(gated, "suspend")["step"] == "checkpointing", "a suspension")
        for verb, asked in (("suspend", "delete"), ("resume", "create")):
            with gated.agent.client(BOB) as api:
                refused = api.get(f"{PODS}/nb/{verb}")
            assert refused.status_code == 403, refused.text
            assert "processes" not in refused.text and "movedBytes" not in refused.text
            reviews = [r["spec"] for r in gated.cluster.kube.reviews("SubjectAccessReview")]
            [last] = [r["resourceAttributes"] for r in reviews if r.get("user") == "bob"][-1:]
            assert {"verb": asked, "resource": "gpumounts", "name": "nb"}.items() <= last.items()
        for pid in (first, second):
            (gates / f"checkpoint-{pid}").touch()
        assert posted.result(timeout=60).status_code == 200
    assert status(container) == "checkpointed - pattern=ok"


def test_progress_of_a_pod_that_is_not_there(gated: World) -> None:
    with gated.agent.client(ALICE) as api:
        missing = api.get(f"{PODS}/ghost/suspend")
    assert missing.status_code == 404, missing.text
