"""The `unused` idle policy's cost per reconcile pass on a node with 8 GPUs: one
ActivitySampler look at all of them (utilization rates and per-process samples, through
pynvml into the fake libnvidia-ml.so.1), next to the session's first look (nvmlInit).
Prints figures; asserts nothing (shared, noisy machines).

    .venv/bin/python -m bench.idle_bench [passes]
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

from tests.fakes import nvml as fake_nvml
from tests.fakes.nvml import FakeActivity, FakeGpu

REPO = Path(__file__).resolve().parents[1]
GPUS = [
    FakeGpu(f"GPU-00000000-0000-4000-8000-{i:012x}", f"0000:{0x18 + i:02x}:00.0", i)
    for i in range(8)
]
SCRIPT = """
import statistics, sys, time
from hotmount.devices.activity import ActivitySampler
uuids, passes = sys.argv[2:], int(sys.argv[1])
sampler = ActivitySampler()
start = time.perf_counter(); sampler.sample(uuids); first = time.perf_counter() - start
times = []
for _ in range(passes):
    start = time.perf_counter(); looks = sampler.sample(uuids)
    times.append(time.perf_counter() - start)
assert all(a.judged for a in looks.values())
times.sort()
median, p99 = statistics.median(times), times[int(len(times) * .99)]
print(f"8 GPUs, {passes} passes: first look (nvmlInit) {first * 1e3:.2f} ms; per pass "
      f"median {median * 1e3:.3f} ms, p99 {p99 * 1e3:.3f} ms ({median / first:.3f} of the first)")
"""


def main() -> None:
    passes = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
    with tempfile.TemporaryDirectory() as scratch:
        work = Path(scratch)
        lib = fake_nvml.build(work / "lib")
        config = fake_nvml.write_config(work / "gpus", GPUS)
        activity = fake_nvml.write_activity(
            work / "activity",
            [
                FakeActivity(g.uuid, gpu=10, processes=((100 + i, 5, 1),))
                for i, g in enumerate(GPUS)
            ],
        )
        env = fake_nvml.with_activity(fake_nvml.env(lib, config), activity)
        env["PYTHONPATH"] = str(REPO)
        uuids = [g.uuid for g in GPUS]
        subprocess.run([sys.executable, "-c", SCRIPT, str(passes), *uuids], env=env, check=True)


if __name__ == "__main__":
    main()
