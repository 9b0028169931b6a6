"""The fake NVML's calls for NVIDIA's device plugin (tests/fakes/nvml/fake_nvml_device_plugin.c),
through pynvml's own ctypes bindings: the plugin reaches the same C ABI through go-nvml's cgo.

The plugin itself runs on this fake on the real node (tests/k8s, conftest `gpus`); here each
call's answer and struct layout is pinned without a node, one subprocess (LD_LIBRARY_PATH
is read as a process starts).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fakes import nvml as fake_nvml
from tests.fakes.nvml import FakeGpu

pytestmark = pytest.mark.skipif(
    fake_nvml.gcc() is None, reason="gcc is needed to build the fake libnvidia-ml.so.1"
)

GPUS = (
    FakeGpu("GPU-0d0d0000-0000-4000-8000-000000000000", "0000:18:00.0", 0),
    FakeGpu("GPU-0d0d0000-0000-4000-8000-000000000001", "0000:3b:00.0", 1),
)

PROBE = r"""
import json, time, pynvml as n
n.nvmlInit()
a, b = n.nvmlDeviceGetHandleByIndex(0), n.nvmlDeviceGetHandleByIndex(1)
memory = n.nvmlDeviceGetMemoryInfo(a)
events = n.nvmlEventSetCreate()
n.nvmlDeviceRegisterEvents(a, n.nvmlDeviceGetSupportedEventTypes(a), events)
start = time.monotonic()
try:
    n.nvmlEventSetWait_v2(events, 300)
    waited = "an event"
except n.NVMLError as error:
    waited = error.value
elapsed = time.monotonic() - start
n.nvmlEventSetFree(events)
try:
    n.nvmlDeviceGetNvLinkState(a, 0)
    nvlink = "enabled"
except n.NVMLError as error:
    nvlink = error.value
print(json.dumps({
    "memory": [memory.total, memory.free, memory.used],
    "capability": list(n.nvmlDeviceGetCudaComputeCapability(a)),
    "driver": n.nvmlSystemGetDriverVersion(),
    "cuda": n.nvmlSystemGetCudaDriverVersion_v2(),
    "topology": n.nvmlDeviceGetTopologyCommonAncestor(a, b),
    "supported_events": n.nvmlDeviceGetSupportedEventTypes(b),
    "waited": waited,
    "waited_at_least_timeout": elapsed >= 0.3,
    "nvlink": nvlink,
}))
"""


def test_the_plugins_calls_answer_as_a_healthy_pcie_h200_would(tmp_path: Path) -> None:
    lib_dir = fake_nvml.build(tmp_path / "nvml")
    config = fake_nvml.write_config(tmp_path / "gpus.conf", GPUS)
    result = subprocess.run(
        [sys.executable, "-c", PROBE], env=fake_nvml.env(lib_dir, config),
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    answers = json.loads(result.stdout)
    assert answers["memory"] == [80 << 30, 80 << 30, 0]
    assert answers["capability"] == [9, 0]
    assert answers["driver"] == "580.95.05"
    assert answers["cuda"] == 13000
    assert answers["topology"] == 40  # NVML_TOPOLOGY_NODE: go-gpuallocator's P2PLinkSameCPU
    # XID critical errors, double- and single-bit ECC: the mask the plugin registers
    assert answers["supported_events"] == 0x8 | 0x2 | 0x1
    assert answers["waited"] == 10  # NVML_ERROR_TIMEOUT: no event on a healthy GPU
    assert answers["waited_at_least_timeout"] is True
    assert answers["nvlink"] == 3  # NVML_ERROR_NOT_SUPPORTED: no NVLink, every link skipped
