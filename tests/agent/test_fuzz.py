"""Schemathesis against a running standalone agent: no 5xx, and refusals change nothing.

The schema is the agent's own `/openapi.json`, fetched over HTTP. Every operation
gets valid and invalid inputs (deterministic: `derandomize`); the container
operations run once with generated IDs and once with a real runc container's ID,
so mounts and unmounts really happen. Afterwards the container must hold exactly
the devices whose mounts answered 2xx (minus those whose unmounts did), and once
those are unmounted, neither the container nor the ledger keeps anything.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error

from tests.support.agent import GPUS, AgentProcess, standalone_agent, write_driver_tree
from tests.support.runc import RuncContainer

pytestmark = pytest.mark.kernel
EXAMPLES = {GenerationMode.POSITIVE: 50, GenerationMode.NEGATIVE: 25}
DEVICE_EXAMPLES = 80
# What the fixture driver tree and the stand-in CDI spec hold, and a few near misses;
# "1" (195:1) and "nvidia.com/gpu=1" (10:229) both want /dev/nvidia1.
DEVICE_REFS = [
    "0",
    "1",
    GPUS[0].uuid,
    GPUS[1].uuid,
    "nvidia.com/gpu=0",
    "nvidia.com/gpu=1",
    "nvidia.com/gpu=disk",
    "nvidia.com/gpu=9",
    "2",
    "0:0:0",
    "GPU-00000000-0000-0000-0000-000000000000",
]


class Standalone:
    def __init__(self, tmp_path: Path, rootfs: Path, cdi_dir: Path) -> None:
        self.state_dir = tmp_path / "state"
        self.container = RuncContainer(tmp_path, rootfs, "v1")
        self.agent: AgentProcess | None = None
        try:
            self.agent = standalone_agent(
                tmp_path,
                write_driver_tree(tmp_path / "driver"),
                cdi_dir,
                ["--anonymous", "--log-level", "WARNING"],
                state_dir=self.state_dir,
            )
        except Exception:
            self.container.stop()
            raise

    def close(self) -> None:
        if self.agent is not None:
            self.agent.stop()
        self.container.stop()


@pytest.fixture
def standalone(tmp_path: Path, rootfs: Path, cdi_dir: Path) -> Iterator[Standalone]:
    made = Standalone(tmp_path, rootfs, cdi_dir)
    try:
        yield made
    finally:
        made.close()


class Tracker:
    """What the fuzz run did to the real container, by the agent's own 2xx answers."""

    def __init__(self, container_id: str) -> None:
        self.container_id = container_id
        self.mounted: dict[str, list[str]] = {}  # device key -> node paths
        self.failures: list[str] = []
        self.calls = 0
        self.mounts = self.unmounts = 0  # 2xx answers that changed the real container
        self.no_invalid_inputs: set[str] = set()  # operations with nothing to make invalid

    def record(self, case: Any, response: Any) -> None:
        self.calls += 1
        if not 200 <= response.status_code < 300:
            return
        if case.path_parameters.get("container_id") != self.container_id:
            return
        body = response.json()
        if case.method.upper() == "POST":
            self.mounts += bool(body["mounted"])
            for device in body["mounted"] + body["alreadyMounted"]:
                self.mounted[device["key"]] = device["paths"]
        elif case.method.upper() == "DELETE":
            self.unmounts += bool(body["unmounted"])
            for key in body["unmounted"]:
                self.mounted.pop(key, None)


def fuzz(
    operation: Any, mode: GenerationMode, agent: AgentProcess, tracker: Tracker, **fixed: Any
) -> None:
    try:
        strategy = operation.as_strategy(generation_mode=mode, **fixed)
    except Exception as exc:  # e.g. nothing to make invalid in an operation without inputs
        if mode is GenerationMode.NEGATIVE:
            tracker.no_invalid_inputs.add(operation.label)
            return
        raise AssertionError(f"{operation.label}: no strategy: {exc}") from exc

    @settings(
        max_examples=EXAMPLES[mode],
        derandomize=True,
        database=None,
        deadline=None,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(st.data())
    def run(data: st.DataObject) -> None:
        case = data.draw(strategy)
        response = case.call(base_url=agent.url, timeout=60)
        tracker.record(case, response)
        try:
            case.validate_response(response, checks=[not_a_server_error])
        except (AssertionError, BaseExceptionGroup) as exc:
            tracker.failures.append(
                f"{case.method} {case.formatted_path}: {exc}\n{case.as_curl_command()}"
            )

    try:
        run()
    except Unsatisfiable:
        if mode is not GenerationMode.NEGATIVE:
            raise
        # no inputs to make invalid (GET /healthz): nothing to do
        tracker.no_invalid_inputs.add(operation.label)


def device_ops(post: Any, delete: Any, agent: AgentProcess, tracker: Tracker) -> None:
    fixed = {"path_parameters": {"container_id": tracker.container_id}}
    posts, deletes = post.as_strategy(**fixed), delete.as_strategy(**fixed)
    refs = st.sampled_from(DEVICE_REFS)

    @settings(
        max_examples=DEVICE_EXAMPLES,
        derandomize=True,
        database=None,
        deadline=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(st.data())
    def run(data: st.DataObject) -> None:
        if data.draw(st.booleans()):
            case = data.draw(posts)
            case.body = {
                "devices": data.draw(st.lists(refs, min_size=1, max_size=3)),
                "force": data.draw(st.booleans()),
            }
        else:
            case = data.draw(deletes)
            case.path_parameters["device"] = data.draw(refs)
            case.query = {"force": data.draw(st.sampled_from(["true", "false"]))}
        response = case.call(base_url=agent.url, timeout=60)
        tracker.record(case, response)
        if response.status_code >= 500:
            tracker.failures.append(
                f"{case.method} {case.formatted_path} {case.body}: {response.status_code} "
                f"{response.text}"
            )

    run()


def test_fuzz_the_standalone_agent(standalone: Standalone) -> None:
    agent, container = standalone.agent, standalone.container
    assert agent is not None
    baseline = container.ls_dev()
    schema = schemathesis.openapi.from_url(f"{agent.url}/openapi.json", timeout=30)
    tracker = Tracker(container.id)

    operations = [result.ok() for result in schema.get_all_operations()]
    labels = {op.label for op in operations}
    assert {
        "POST /v1/containers/{container_id}/devices",
        "DELETE /v1/containers/{container_id}/devices/{device}",
        "GET /v1/containers/{container_id}/devices",
    } <= labels, labels
    assert not any("/pods/" in label or "reassign" in label for label in labels), labels
    for operation in operations:
        for mode in EXAMPLES:
            fuzz(operation, mode, agent, tracker)
            if "{container_id}" in operation.path:
                fuzz(
                    operation,
                    mode,
                    agent,
                    tracker,
                    path_parameters={"container_id": container.id},
                )

    # Then sequences of mounts and unmounts of real (and near-real) device names.
    by_label = {op.label: op for op in operations}
    device_ops(
        by_label["POST /v1/containers/{container_id}/devices"],
        by_label["DELETE /v1/containers/{container_id}/devices/{device}"],
        agent,
        tracker,
    )

    assert not tracker.failures, "\n\n".join(tracker.failures[:10])
    assert tracker.calls > 300  # the fuzzer really ran: 7 operations, 75 cases each
    # A mount or an unmount always has inputs to make invalid: those were fuzzed too.
    unfuzzed = sorted(op for op in tracker.no_invalid_inputs if not op.startswith("GET "))
    assert unfuzzed == [], unfuzzed
    # and really mounted and unmounted: else the checks below hold for an empty container
    assert tracker.mounts > 0 and tracker.unmounts > 0, (tracker.mounts, tracker.unmounts)

    # The container holds exactly what the 2xx answers said, nothing a refusal left behind.
    with httpx.Client(base_url=agent.url, timeout=60) as api:
        listed = api.get(f"/v1/containers/{container.id}/devices")
        assert listed.status_code == 200, listed.text
        held = {d["key"]: d["paths"] for c in listed.json()["containers"] for d in c["devices"]}
        assert held == tracker.mounted
        expected_nodes = {Path(p).name for paths in tracker.mounted.values() for p in paths}
        added = set(container.ls_dev()) - set(baseline)
        # the control node comes with any GPU, listed under none of them
        shared = {"nvidiactl"} if tracker.mounted else set()
        assert expected_nodes <= added <= expected_nodes | shared

        for key in list(tracker.mounted):
            answer = api.delete(
                f"/v1/containers/{container.id}/devices/{key}", params={"force": "true"}
            )
            assert answer.status_code == 200, answer.text
        listed = api.get(f"/v1/containers/{container.id}/devices").json()
        assert [d for c in listed["containers"] for d in c["devices"]] == []
        holders = [d["holder"] for d in api.get("/v1/devices").json()["devices"]]
        assert holders == [None] * len(holders)
    assert container.ls_dev() == baseline
    records = [
        json.loads(p.read_text()) for p in (standalone.state_dir / "containers").glob("*.json")
    ]
    assert records == []
    claims = [p.name for p in (standalone.state_dir / "claims").iterdir()]
    assert claims == []
