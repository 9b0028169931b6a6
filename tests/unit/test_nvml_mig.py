"""MIG from NVML: UUIDs, instance IDs, profile and memory, joined with /proc's capability nodes.

pynvml's own ctypes calls go into the fake libnvidia-ml.so.1 (tests/fakes/nvml), which
lists MIG devices as the driver does: at indexes with holes below the maximum count. The
host tree's /proc says which instances exist and which capability nodes they need; NVML
says what they are. Each case runs a subprocess (pynvml finds the library through
LD_LIBRARY_PATH as the process starts).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from cli.output import devices_table
from hotmount.devices import mig_nvml
from hotmount.devices.mig import MigInstance
from hotmount.wire.schemas import DeviceInfo, DeviceList, MigInfo
from tests.fakes import nvml as fake_nvml
from tests.fakes.nvml import FakeGpu, FakeMig
from tests.unit.hosttree import (
    BY_INDEX,
    MIG_CI,
    MIG_CI_CAP,
    MIG_GI,
    MIG_GI_CAP,
    MIG_GPU,
    MIG_KEY,
    NVIDIA_CAPS_MAJOR,
    build_host,
    write,
)

pytestmark = pytest.mark.skipif(
    fake_nvml.gcc() is None, reason="gcc is needed to build the fake libnvidia-ml.so.1"
)

REPO = Path(__file__).resolve().parents[2]

# The host tree's GPUs as NVML sees them: the MIG parent (minor 2) has MIG on, minor 5
# is MIG-capable with MIG off, minor 0 is not MIG-capable at all.
NVML_GPUS = (
    FakeGpu(BY_INDEX[0].uuid, BY_INDEX[0].bus_id, BY_INDEX[0].minor, mig=False),
    FakeGpu(MIG_GPU.uuid, MIG_GPU.bus_id, MIG_GPU.minor, mig=True),
    FakeGpu(BY_INDEX[2].uuid, BY_INDEX[2].bus_id, BY_INDEX[2].minor),
)
# GI 2 / CI 0 is a second instance in /proc (added below); GI 5 has no capability nodes.
MIG_A = FakeMig(
    "MIG-a1a1a1a1-0000-4000-8000-0000000000a1", MIG_GPU.uuid, MIG_GI, MIG_CI,
    profile="1g.18gb", memory_mib=16384, slot=0,
)  # fmt: skip
MIG_B = FakeMig(
    "MIG-b2b2b2b2-0000-4000-8000-0000000000b2", MIG_GPU.uuid, 2, 0,
    profile="1c.2g.35gb", memory_mib=32768, slot=4,
)  # fmt: skip
MIG_ORPHAN = FakeMig("MIG-c3c3c3c3-0000-4000-8000-0000000000c3", MIG_GPU.uuid, 5, 0, slot=6)
MIG_B_KEY = f"MIG-{MIG_GPU.uuid}/2/0"


@pytest.fixture(scope="module")
def lib_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return fake_nvml.build(tmp_path_factory.mktemp("fake-nvml"))


@pytest.fixture
def host(tmp_path: Path) -> Path:
    root = build_host(tmp_path / "host")
    # mig-minors already maps gpu2/gi2 (40) and gpu2/gi2/ci0 (41): make that instance exist.
    write(root, f"/proc/driver/nvidia/capabilities/gpu{MIG_GPU.minor}/mig/gi2/ci0/access")
    return root


@pytest.fixture
def config(tmp_path: Path) -> Path:
    return fake_nvml.write_config(tmp_path / "gpus.conf", NVML_GPUS, (MIG_A, MIG_B, MIG_ORPHAN))


def run_python(code: str, env: dict[str, str], *args: str) -> str:
    result = subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True, text=True, timeout=60, cwd=REPO, check=False,
        env={**env, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return result.stdout + result.stderr


def devices(host: Path, env: dict[str, str], *flags: str) -> tuple[dict[str, dict], str]:
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
    return {d["key"]: d for d in json.loads(result.stdout) if d["kind"] == "mig"}, result.stderr


def caps_nodes(gi_cap: int, ci_cap: int) -> list[str]:
    return [
        f"/dev/nvidia{MIG_GPU.minor}",
        f"/dev/nvidia-caps/nvidia-cap{gi_cap}",
        f"/dev/nvidia-caps/nvidia-cap{ci_cap}",
    ]


def test_mig_devices_get_their_nvml_uuid_profile_and_memory(
    host: Path, lib_dir: Path, config: Path
) -> None:
    migs, log = devices(host, fake_nvml.env(lib_dir, config))
    # Both /proc instances, joined with NVML on (parent minor, GI, CI): found at slots 0
    # and 4 across the holes. The key keeps its /proc form; the UUID is a name it answers to.
    assert sorted(migs) == sorted([MIG_KEY, MIG_B_KEY])
    a, b = migs[MIG_KEY], migs[MIG_B_KEY]
    assert (a["uuid"], a["parent"], a["aliases"]) == (
        MIG_A.uuid,
        MIG_GPU.uuid,
        [MIG_A.uuid, f"{MIG_GPU.index}:{MIG_GI}:{MIG_CI}"],
    )
    assert a["mig"] == {
        "gpuInstance": MIG_GI,
        "computeInstance": MIG_CI,
        "source": "nvml",
        "profile": "1g.18gb",
        "memoryMiB": 16384,
    }
    assert (b["uuid"], b["mig"]["profile"], b["mig"]["memoryMiB"]) == (
        MIG_B.uuid,
        "1c.2g.35gb",
        32768,
    )
    # The device nodes still come from /proc/driver/nvidia-caps/mig-minors.
    assert [n["path"] for n in a["nodes"]] == caps_nodes(MIG_GI_CAP, MIG_CI_CAP)
    assert [n["path"] for n in b["nodes"]] == caps_nodes(40, 41)
    assert {n["major"] for n in b["nodes"][1:]} == {NVIDIA_CAPS_MAJOR}
    # NVML's third device has no capability nodes: nothing to mount, and it is said.
    assert MIG_ORPHAN.uuid not in json.dumps(migs)
    assert f"NVML lists MIG device {MIG_ORPHAN.uuid} (GPU minor 2, GI 5, CI 0)" in log


def test_without_nvml_mig_instances_come_from_proc_without_uuids(
    host: Path, lib_dir: Path, config: Path
) -> None:
    migs, _ = devices(host, fake_nvml.env(lib_dir, config), "--no-nvml")
    assert sorted(migs) == sorted([MIG_KEY, MIG_B_KEY])
    a = migs[MIG_KEY]
    assert (a["uuid"], a["aliases"]) == (None, [f"{MIG_GPU.index}:{MIG_GI}:{MIG_CI}"])
    assert a["mig"] == {
        "gpuInstance": MIG_GI,
        "computeInstance": MIG_CI,
        "source": "procfs",
        "profile": None,
        "memoryMiB": None,
    }
    assert [n["path"] for n in a["nodes"]] == caps_nodes(MIG_GI_CAP, MIG_CI_CAP)


RESOLVE = """
import sys
from hotmount.devices.inventory import Inventory
from hotmount.errors import DeviceNotFound
from hotmount.hostfs import HostRoot
inventory = Inventory.load(HostRoot(__import__("pathlib").Path(sys.argv[1])), cdi_dirs=[])
for ref in sys.argv[2:]:
    try:
        device = inventory.resolve(ref)
        print("RESOLVED", ref, device.key, device.uuid)
    except DeviceNotFound as exc:
        print("NOTFOUND", ref)
"""


def test_a_mig_uuid_names_its_instance_and_only_with_nvml(
    host: Path, lib_dir: Path, config: Path
) -> None:
    refs = (MIG_A.uuid, MIG_B.uuid, MIG_ORPHAN.uuid, MIG_KEY)
    out = run_python(RESOLVE, fake_nvml.env(lib_dir, config), str(host), *refs)
    assert [line for line in out.splitlines() if line.startswith(("RESOLVED", "NOTFOUND"))] == [
        f"RESOLVED {MIG_A.uuid} {MIG_KEY} {MIG_A.uuid}",
        f"RESOLVED {MIG_B.uuid} {MIG_B_KEY} {MIG_B.uuid}",
        f"NOTFOUND {MIG_ORPHAN.uuid}",
        f"RESOLVED {MIG_KEY} {MIG_KEY} {MIG_A.uuid}",
    ]
    # Without NVML there is no UUID to go by: /proc's names only.
    out = run_python(RESOLVE, fake_nvml.env(None, None), str(host), MIG_A.uuid, MIG_KEY)
    assert [line for line in out.splitlines() if line.startswith(("RESOLVED", "NOTFOUND"))] == [
        f"NOTFOUND {MIG_A.uuid}",
        f"RESOLVED {MIG_KEY} {MIG_KEY} None",
    ]


PYNVML_CALLS = """
import pynvml
pynvml.nvmlInit()
for i in range(pynvml.nvmlDeviceGetCount()):
    gpu = pynvml.nvmlDeviceGetHandleByIndex(i)
    try:
        mode = pynvml.nvmlDeviceGetMigMode(gpu)
    except pynvml.NVMLError_NotSupported:
        mode = "not supported"
    count = pynvml.nvmlDeviceGetMaxMigDeviceCount(gpu)
    print("GPU", i, mode, count)
    for j in range(count):
        try:
            mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(gpu, j)
        except pynvml.NVMLError_NotFound:
            print(" ", j, "not found")
            continue
        attrs = pynvml.nvmlDeviceGetAttributes_v2(mig)
        parent = pynvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(mig)
        again = pynvml.nvmlDeviceGetHandleByUUID(pynvml.nvmlDeviceGetUUID(mig))
        print(" ", j, pynvml.nvmlDeviceGetUUID(mig), pynvml.nvmlDeviceGetGpuInstanceId(mig),
              pynvml.nvmlDeviceGetComputeInstanceId(mig), pynvml.nvmlDeviceGetName(mig),
              attrs.gpuInstanceSliceCount, attrs.computeInstanceSliceCount, attrs.memorySizeMB,
              pynvml.nvmlDeviceGetUUID(parent) == pynvml.nvmlDeviceGetUUID(gpu),
              pynvml.nvmlDeviceIsMigDeviceHandle(mig).value,
              pynvml.nvmlDeviceGetUUID(again) == pynvml.nvmlDeviceGetUUID(mig))
    try:
        pynvml.nvmlDeviceGetGpuInstanceId(gpu)
    except pynvml.NVMLError_InvalidArgument:
        print("  a GPU handle has no GPU instance")
pynvml.nvmlShutdown()
"""


def test_the_fake_answers_pynvml_mig_calls_as_nvml_h_says(lib_dir: Path, config: Path) -> None:
    out = run_python(PYNVML_CALLS, fake_nvml.env(lib_dir, config))
    holes = [f"  {j} not found" for j in (1, 2, 3, 5)]
    assert out.splitlines() == [
        "GPU 0 [0, 0] 0",
        "  a GPU handle has no GPU instance",
        "GPU 1 [1, 1] 7",
        f"  0 {MIG_A.uuid} 1 0 NVIDIA H200 MIG 1g.18gb 1 1 16384 True 1 True",
        *holes[:3],
        f"  4 {MIG_B.uuid} 2 0 NVIDIA H200 MIG 1c.2g.35gb 2 1 32768 True 1 True",
        holes[3],
        f"  6 {MIG_ORPHAN.uuid} 5 0 NVIDIA H200 MIG 1g.10gb 1 1 9856 True 1 True",
        "  a GPU handle has no GPU instance",
        "GPU 2 not supported 0",
        "  a GPU handle has no GPU instance",
    ]


@pytest.mark.parametrize(
    ("name", "profile"),
    [
        ("NVIDIA A100-SXM4-40GB MIG 1g.5gb", "1g.5gb"),
        ("NVIDIA H100 80GB HBM3 MIG 1c.2g.20gb", "1c.2g.20gb"),
        ("NVIDIA H100 80GB HBM3 MIG 1g.10gb+me", "1g.10gb+me"),
        ("NVIDIA H200", None),
        ("MIG", None),
        ("", None),
    ],
    ids=["a100", "compute-slice", "media-extension", "a-whole-gpu", "bare-mig", "empty"],
)
def test_the_profile_is_the_tail_of_the_mig_devices_name(name: str, profile: str | None) -> None:
    assert mig_nvml.profile_from_name(name) == profile


def test_join_keeps_procs_instances_and_pairs_them_by_minor_gi_ci() -> None:
    here = MigInstance(2, 1, 0, 30, 31)
    other_gpu = MigInstance(5, 1, 0, 50, 51)
    unlisted = MigInstance(2, 2, 0, 40, 41)
    listed = mig_nvml.NvmlMig(2, 1, 0, "MIG-x", "1g.10gb", 9856)
    orphan = mig_nvml.NvmlMig(2, 7, 0, "MIG-y", None, None)
    # The same GI/CI on another GPU is not the same instance.
    assert mig_nvml.join([here, other_gpu, unlisted], [listed, orphan]) == [
        (here, listed),
        (other_gpu, None),
        (unlisted, None),
    ]
    assert mig_nvml.join([here], None) == [(here, None)]


def test_nvcli_list_shows_a_mig_profile_and_says_when_there_is_no_uuid() -> None:
    def mig(uuid: str | None, source: str, profile: str | None) -> DeviceInfo:
        return DeviceInfo(
            key=f"MIG-GPU-x/{1 if uuid else 2}/0",
            kind="mig",
            uuid=uuid,
            nodes=[],
            mig=MigInfo(gpu_instance=1, compute_instance=0, source=source, profile=profile),
        )

    listing = DeviceList(
        node="n", devices=[mig("MIG-a1", "nvml", "1g.18gb"), mig(None, "procfs", None)]
    )
    rows = devices_table([listing]).splitlines()
    assert rows[1].split()[:5] == ["n", "-", "MIG-GPU-x/1/0", "mig", "1g.18gb"]
    assert "MIG-a1" in rows[1].split()
    assert "<none: no NVML>" in rows[2]
