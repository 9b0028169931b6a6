"""The `unused` policy's input (hotmount/devices/activity.py) through pynvml's own ctypes calls
into the fake libnvidia-ml.so.1: utilization rates and per-process samples, read from an
activity file the test rewrites while one NVML session stays open."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fakes import nvml as fake_nvml
from tests.fakes.nvml import FakeActivity, FakeGpu

pytestmark = pytest.mark.skipif(
    fake_nvml.gcc() is None, reason="gcc is needed to build the fake libnvidia-ml.so.1"
)

REPO = Path(__file__).resolve().parents[2]
A = FakeGpu("GPU-0a11af00-0000-4000-8000-0000000000af", "0000:AF:00.0", 7)
B = FakeGpu("GPU-0a113b00-0000-4000-8000-00000000003b", "0000:3B:00.0", 2)
MIG = FakeGpu("GPU-0a111800-0000-4000-8000-000000000018", "0000:18:00.0", 1)

# One sampler, one look per line read from stdin: the test rewrites the file in between.
SCRIPT = """
import json, sys
from hotmount.devices.activity import ActivitySampler
sampler = ActivitySampler()
uuids = sys.argv[1:]
for _ in sys.stdin:
    looks = sampler.sample(uuids)
    print(json.dumps({u: {"judged": a.judged, "why": a.why_not, "sm": a.sm_percent,
        "mem": a.memory_percent, "own": a.busy_for([4242]),
        "util": a.utilization_for([4242]), "procs": sorted(a.processes)}
        for u, a in looks.items()}), flush=True)
"""


@pytest.fixture(scope="module")
def lib_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return fake_nvml.build(tmp_path_factory.mktemp("fake-nvml"))


def test_activity_is_read_on_every_look_from_one_session(lib_dir: Path, tmp_path: Path) -> None:
    config = fake_nvml.write_config(tmp_path / "gpus.conf", [A, B, MIG])
    activity = tmp_path / "activity"
    fake_nvml.write_activity(activity, [FakeActivity(MIG.uuid, unsupported=True)])
    env = fake_nvml.with_activity(fake_nvml.env(lib_dir, config), activity)
    env["PYTHONPATH"] = str(REPO)
    sampler = subprocess.Popen(
        [sys.executable, "-c", SCRIPT, A.uuid, B.uuid, MIG.uuid, "GPU-not-there"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    assert sampler.stdin is not None and sampler.stdout is not None

    def look() -> dict[str, dict]:
        sampler.stdin.write("\n")
        sampler.stdin.flush()
        return json.loads(sampler.stdout.readline())

    try:
        idle = look()
        assert idle[A.uuid] == {
            "judged": True, "why": None, "sm": 0, "mem": 0, "own": False, "util": 0.0,
            "procs": [],
        }  # fmt: skip
        assert idle[MIG.uuid]["judged"] is False and "Not" in idle[MIG.uuid]["why"]
        assert idle["GPU-not-there"]["judged"] is False

        fake_nvml.write_activity(
            activity,
            [
                FakeActivity(A.uuid, processes=((4242, 37, 5), (999, 80, 0))),
                FakeActivity(B.uuid, gpu=0, memory=12),  # memory copies alone are use
                FakeActivity(MIG.uuid, unsupported=True),
            ],
        )
        busy = look()
        assert busy[A.uuid]["own"] is True and busy[A.uuid]["procs"] == [999, 4242]
        assert busy[A.uuid]["util"] == 0.37  # its own process' share, not the device's
        assert busy[B.uuid]["own"] is True and busy[B.uuid]["mem"] == 12

        fake_nvml.write_activity(activity, [FakeActivity(A.uuid, processes=((999, 80, 0),))])
        other = look()
        assert other[A.uuid]["own"] is False  # another process' samples are not ours
        assert other[B.uuid]["own"] is False  # back to idle
    finally:
        sampler.stdin.close()
        sampler.wait(timeout=30)
        sampler.stdout.close()
    assert sampler.returncode == 0


# One sampler; each stdin line names the GPUs to look at ("retain" first: only prune).
CURSOR_SCRIPT = """
import json, sys
from hotmount.devices.activity import ActivitySampler
sampler = ActivitySampler()
for line in sys.stdin:
    words = line.split()
    if words[0] == "retain":
        sampler.retain(words[1:])
        print("{}", flush=True)
        continue
    looks = sampler.sample(words)
    print(json.dumps({u: a.busy_for([4242]) for u, a in looks.items()}), flush=True)
"""


def test_a_look_at_one_gpu_keeps_the_other_gpus_cursors(lib_dir: Path, tmp_path: Path) -> None:
    """The driver keeps process samples for a while. A's burst was seen once; a look at B
    alone (the idle reclaim's last look before taking B) must not make A's next look read
    that burst again as new use, or A's idle clock restarts and its reclaim comes late."""
    config = fake_nvml.write_config(tmp_path / "gpus.conf", [A, B])
    activity = tmp_path / "activity"
    burst = FakeActivity(A.uuid, processes=((4242, 50, 0),), sampled_at=1_000_000)
    fake_nvml.write_activity(activity, [burst])
    env = fake_nvml.with_activity(fake_nvml.env(lib_dir, config), activity)
    env["PYTHONPATH"] = str(REPO)
    sampler = subprocess.Popen(
        [sys.executable, "-c", CURSOR_SCRIPT],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    assert sampler.stdin is not None and sampler.stdout is not None

    def ask(*words: str) -> dict[str, bool]:
        sampler.stdin.write(" ".join(words) + "\n")
        sampler.stdin.flush()
        return json.loads(sampler.stdout.readline())

    try:
        assert ask(A.uuid, B.uuid) == {A.uuid: True, B.uuid: False}  # the burst, once
        assert ask(A.uuid, B.uuid) == {A.uuid: False, B.uuid: False}  # seen: not again

        assert ask(B.uuid) == {B.uuid: False}  # one GPU's look

        assert ask(A.uuid, B.uuid) == {A.uuid: False, B.uuid: False}

        ask("retain", B.uuid)  # A is no longer looked at: its cursor goes
        assert ask(A.uuid) == {A.uuid: True}  # a new cursor reads the buffer from its start
    finally:
        sampler.stdin.close()
        sampler.wait(timeout=30)
        sampler.stdout.close()
    assert sampler.returncode == 0
