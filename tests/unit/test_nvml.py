"""The NVML path, through pynvml's own ctypes calls into a fake libnvidia-ml.so.1 built from C.

The fake NVML and the host tree's /proc/driver/nvidia disagree on purpose (other
UUIDs, another order, other minors), so every answer says which of the two was read.
pynvml finds the library through LD_LIBRARY_PATH as the process starts: each case
runs a subprocess.
"""

from __future__ import annotations

import ctypes
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fakes import nvml as fake_nvml
from tests.fakes.nvml import FakeGpu
from tests.unit.hosttree import BY_INDEX, MIG_CI, MIG_GI, build_host

pytestmark = pytest.mark.skipif(
    fake_nvml.gcc() is None, reason="gcc is needed to build the fake libnvidia-ml.so.1"
)

REPO = Path(__file__).resolve().parents[2]

# NVML's index order, which is neither PCI order nor the host tree's; minor 2 is the
# host tree's MIG parent, so the MIG instance hangs off an NVML GPU.
NVML_GPUS = (
    FakeGpu("GPU-0a11af00-0000-4000-8000-0000000000af", "0000:AF:00.0", 7, (4242, 4343)),
    FakeGpu("GPU-0a113b00-0000-4000-8000-00000000003b", "0000:3B:00.0", 2, (), (5151,)),
    FakeGpu("GPU-0a111800-0000-4000-8000-000000000018", "0000:18:00.0", 1),
    # Forty processes: all of them have to come back through the two-call size dance.
    FakeGpu("GPU-0a11d800-0000-4000-8000-0000000000d8", "0001:D8:00.0", 11, tuple(range(100, 140))),
)
NVML_EXPECTED = [
    (0, 7, NVML_GPUS[0].uuid, "0000:af:00.0"),
    (1, 2, NVML_GPUS[1].uuid, "0000:3b:00.0"),
    (2, 1, NVML_GPUS[2].uuid, "0000:18:00.0"),
    (3, 11, NVML_GPUS[3].uuid, "0001:d8:00.0"),
]
PROCFS_EXPECTED = [(i, BY_INDEX[i].minor, BY_INDEX[i].uuid, BY_INDEX[i].bus_id) for i in range(3)]


@pytest.fixture(scope="module")
def lib_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return fake_nvml.build(tmp_path_factory.mktemp("fake-nvml"))


@pytest.fixture
def host(tmp_path: Path) -> Path:
    return build_host(tmp_path / "host")


@pytest.fixture
def config(tmp_path: Path) -> Path:
    return fake_nvml.write_config(tmp_path / "gpus.conf", NVML_GPUS)


def devices(host: Path, env: dict[str, str], *flags: str) -> tuple[list[dict], str]:
    result = subprocess.run(
        [
            sys.executable, "-m", "hotmount", "devices", "-o", "json", "-v",
            "--host-root", str(host), "--cdi-dir", "/etc/cdi",
            "--state-dir", str(host.parent / "state"), *flags,
        ],
        capture_output=True, text=True, timeout=60, cwd=REPO, check=False,
        env={**env, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout), result.stderr


def gpus(found: list[dict]) -> list[tuple[int, int, str, str]]:
    return [(d["index"], d["minor"], d["uuid"], d["pciBusId"]) for d in found if d["kind"] == "gpu"]


def test_gpus_come_from_nvml_in_its_order_with_bus_ids_normalised(
    host: Path, lib_dir: Path, config: Path
) -> None:
    found, _ = devices(host, fake_nvml.env(lib_dir, config))
    assert gpus(found) == NVML_EXPECTED
    by_uuid = {d["uuid"]: d for d in found if d["kind"] == "gpu"}
    first = by_uuid[NVML_GPUS[0].uuid]
    assert first["aliases"] == ["0"]
    assert first["nodes"] == [
        {"path": "/dev/nvidia7", "major": 195, "minor": 7, "fileMode": "0666", "permissions": "rw"}
    ]
    # The host tree's MIG instance is on minor 2: NVML's GPU index 1 is its parent now.
    parent = NVML_GPUS[1].uuid
    migs = [d for d in found if d["kind"] == "mig"]
    assert [(d["key"], d["parent"], d["aliases"]) for d in migs] == [
        (f"MIG-{parent}/{MIG_GI}/{MIG_CI}", parent, [f"1:{MIG_GI}:{MIG_CI}"])
    ]


def test_no_nvml_flag_reads_procfs_even_with_nvml_present(
    host: Path, lib_dir: Path, config: Path
) -> None:
    found, _ = devices(host, fake_nvml.env(lib_dir, config), "--no-nvml")
    assert gpus(found) == PROCFS_EXPECTED


def test_without_the_library_procfs_is_read(host: Path) -> None:
    try:
        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        pass
    else:
        pytest.skip("a real libnvidia-ml.so.1 is installed here; it cannot be made absent")
    found, log = devices(host, fake_nvml.env(None, None))
    assert gpus(found) == PROCFS_EXPECTED
    assert "NVML unavailable (NVML Shared Library Not Found)" in log


def test_a_failing_nvml_init_falls_back_to_procfs(host: Path, lib_dir: Path, config: Path) -> None:
    env = fake_nvml.env(lib_dir, config, init_error=fake_nvml.NVML_ERROR_DRIVER_NOT_LOADED)
    found, log = devices(host, env)
    assert gpus(found) == PROCFS_EXPECTED
    # The fake was loaded and said no, rather than not being found.
    assert "NVML unavailable (Driver Not Loaded)" in log


def test_no_driver_configured_falls_back_to_procfs(host: Path, lib_dir: Path) -> None:
    found, log = devices(host, fake_nvml.env(lib_dir, None))
    assert gpus(found) == PROCFS_EXPECTED
    assert "NVML unavailable (Driver Not Loaded)" in log


def nvml_pids(env: dict[str, str], *uuid_lists: list[str]) -> list[list[int]]:
    """`usage.nvml_pids` for each list of UUIDs, in one process (the retry timer included)."""
    code = (
        "import json, sys\n"
        "from hotmount.host import usage\n"
        "print(json.dumps([sorted(usage.nvml_pids(u)) for u in json.loads(sys.argv[1])]))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code, json.dumps(uuid_lists)],
        capture_output=True, text=True, timeout=60, cwd=REPO, check=False,
        env={**env, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_nvml_pids_reports_compute_and_graphics_processes(lib_dir: Path, config: Path) -> None:
    unknown = "GPU-ffffffff-0000-4000-8000-0000000000ff"
    a, b, c, d = (gpu.uuid for gpu in NVML_GPUS)
    assert nvml_pids(
        fake_nvml.env(lib_dir, config), [a], [b], [c], [d], [unknown], [unknown, a, b], []
    ) == [
        [4242, 4343],
        [5151],
        [],
        list(range(100, 140)),
        [],
        [4242, 4343, 5151],
        [],
    ]


def test_a_session_opened_earlier_sees_the_processes_of_now(lib_dir: Path, config: Path) -> None:
    """A real driver's process lists are live in a session opened before the process
    started (the agent keeps one, hotmount/devices/activity.py): the fake reads them again at
    each query, the config replaced by a rename as the tier's flows replace it."""
    later = (FakeGpu(NVML_GPUS[0].uuid, NVML_GPUS[0].bus_id, NVML_GPUS[0].minor, (777,)),
             *NVML_GPUS[1:])  # fmt: skip
    replacement = fake_nvml.write_config(config.with_name("next.conf"), later)
    code = (
        "import os, sys, pynvml\n"
        "pynvml.nvmlInit()\n"
        "h = pynvml.nvmlDeviceGetHandleByIndex(0)\n"
        "before = [p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h)]\n"
        "os.replace(sys.argv[1], sys.argv[2])\n"
        "after = [p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h)]\n"
        "print(before, after, pynvml.nvmlDeviceGetUUID(h))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code, str(replacement), str(config)],
        capture_output=True, text=True, timeout=60, cwd=REPO, check=False,
        env=fake_nvml.env(lib_dir, config),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.split(maxsplit=2) == ["[4242,", "4343]", f"[777] {NVML_GPUS[0].uuid}\n"]


def test_nvml_pids_is_empty_where_nvml_fails(lib_dir: Path, config: Path) -> None:
    uuid = NVML_GPUS[0].uuid
    env = fake_nvml.env(lib_dir, config, init_error=fake_nvml.NVML_ERROR_DRIVER_NOT_LOADED)
    assert nvml_pids(env, [uuid], [uuid]) == [[], []]


def test_the_fake_is_what_pynvml_loads(lib_dir: Path, config: Path) -> None:
    """The symbols pynvml resolves are the fake's, with nvml.h's struct sizes."""
    code = (
        "import ctypes, pynvml\n"
        "pynvml.nvmlInit()\n"
        "h = pynvml.nvmlDeviceGetHandleByIndex(3)\n"
        "info = pynvml.nvmlDeviceGetPciInfo(h)\n"
        "maps = open('/proc/self/maps').read().split()\n"
        "lib = next(w for w in maps if w.endswith('/libnvidia-ml.so.1'))\n"
        "print(lib, info.busId, info.busIdLegacy, hex(info.domain),"
        " hex(info.bus), pynvml.nvmlDeviceGetCount())\n"
        "pynvml.nvmlShutdown()\n"
        "try:\n"
        "    pynvml.nvmlDeviceGetCount()\n"
        "except pynvml.NVMLError_Uninitialized as exc:\n"
        "    print(exc)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True, text=True, timeout=60, check=False,
        env=fake_nvml.env(lib_dir, config),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.split("\n") == [
        f"{lib_dir / fake_nvml.SONAME} 00000001:D8:00.0 0001:D8:00.0 0x1 0xd8 4",
        "Uninitialized",
        "",
    ]
