"""Flow 18 (issue 19): a pod with neither the NVIDIA runtime nor NVIDIA_VISIBLE_DEVICES runs
the stand-in `nvidia-smi` after `nvcli mount --with-driver`, and not after the unmount.

The pod's image is plain: busybox with a glibc (loader and libc, as any Debian-based
image has) and no NVIDIA file; its `/etc/fake-gpus.conf` only tells the stand-in NVML
which GPUs to report, where a real one asks the kernel. The stand-in driver
(tests/fakes/driver) is built into a directory of the host that the agent's pod does not
mount, and a CDI spec in the host's `/var/run/cdi` mounts it, as the GPU Operator's
CDI mode (`nvidia-ctk cdi generate`) does for the files under `/run/nvidia/driver`: the
agent finds those hostPaths through the host's `/` that the chart mounts at `/host`
(`driver.hostRoot`, docs/driver.md), not in its own container. This machine's `/` is a
private mount, on which containerd refuses HostToContainer: the propagation is None here.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fakes import driver as stand_in
from tests.fakes import nvml
from tests.k8s import flows
from tests.k8s.flows import GRANTED, NVML_GPUS
from tests.k8s.node.cluster import Node
from tests.support.runc import make_rootfs

REPO = Path(__file__).resolve().parents[2]
IMAGE = "hotmount.test/plain-glibc:1"
SPEC = Path("/var/run/cdi/hotmount-test-driver.yaml")
LIB = stand_in.LIB_DIR
VERSION = stand_in.VERSION
SMI = "FAKE_NVML_CONFIG=/etc/fake-gpus.conf exec nvidia-smi"

pytestmark = pytest.mark.skipif(nvml.gcc() is None, reason="gcc builds the stand-in driver")


@pytest.fixture(scope="module")
def plain_image(node: Node, tmp_path_factory: pytest.TempPathFactory) -> str:
    """busybox, a glibc, the fake NVML's GPU list; no NVIDIA library, tool or variable."""
    work = tmp_path_factory.mktemp("plain-image")
    rootfs = make_rootfs(work)
    stand_in.add_glibc(rootfs)
    (rootfs / "etc").mkdir()
    nvml.write_config(rootfs / "etc/fake-gpus.conf", [NVML_GPUS[0]])
    config = work / "config.json"
    config.write_text(json.dumps({"Env": ["PATH=/usr/bin:/bin"], "Cmd": ["sleep", "100000"]}))
    archive = work / "plain.oci.tar"
    subprocess.run(
        [
            "python3", str(REPO / "scripts" / "oci_archive.py"), "--rootfs", str(rootfs),
            "--name", IMAGE, "--config", str(config), "--epoch", "0", "--arch", "amd64",
            "--out", str(archive),
        ],
        check=True, capture_output=True, timeout=600,
    )  # fmt: skip
    node.import_image(archive)
    return IMAGE


@pytest.fixture(scope="module")
def cdi_driver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The stand-in driver in a host directory the agent's pod does not mount, and a CDI
    spec (as nvidia-ctk writes one: spec-level mounts and hooks) naming its files."""
    root = stand_in.build_root(tmp_path_factory.mktemp("host-driver"))
    mounts = "".join(
        f"    - {{hostPath: {root}{path}, containerPath: {path}, "
        "options: [ro, nosuid, nodev, bind]}\n"
        for path in (f"{LIB}/libnvidia-ml.so.{VERSION}", f"{LIB}/libcuda.so.{VERSION}",
                     "/usr/bin/nvidia-smi")
    )  # fmt: skip
    SPEC.parent.mkdir(parents=True, exist_ok=True)
    SPEC.write_text(
        "cdiVersion: 0.6.0\n"
        "kind: nvidia.com/gpu\n"
        "devices:\n"
        '  - name: "all"\n'
        "    containerEdits:\n"
        "      deviceNodes: [{path: /dev/nvidia0, type: c, major: 195, minor: 0}]\n"
        "containerEdits:\n"
        f"  mounts:\n{mounts}"
        "  hooks:\n"
        "    - hookName: createContainer\n"
        "      path: /usr/bin/nvidia-cdi-hook\n"
        f"      args: [nvidia-cdi-hook, create-symlinks, --link, libcuda.so.1::{LIB}/libcuda.so]\n"
    )
    try:
        yield root
    finally:
        SPEC.unlink(missing_ok=True)


@pytest.fixture(scope="module")
def host_view(hotmount: flows.Release) -> Iterator[flows.Release]:
    """The release with the host's / at /host for the agent; the chart's defaults after."""
    hotmount.set_driver({"hostRoot": "/host", "hostRootPropagation": "None"})
    try:
        yield hotmount
    finally:
        hotmount.set_driver({})


def _smi(node: Node, pod: str) -> subprocess.CompletedProcess[str]:
    return node.kubectl("exec", pod, "--", "sh", "-c", SMI, check=False)


def test_a_plain_pod_runs_nvidia_smi_after_mount_with_driver(
    node: Node, host_view: flows.Release, plain_image: str, cdi_driver: Path
) -> None:
    name = flows.new_name("plain-pod")
    manifest = flows.pod_manifest(name, image=plain_image)
    container = manifest["spec"]["containers"][0]
    del container["env"]  # no NVIDIA_VISIBLE_DEVICES, and no runtimeClassName: plain runc
    assert "runtimeClassName" not in manifest["spec"]
    with flows.running_pod(node, manifest) as pod:
        before = _smi(node, pod)
        assert before.returncode != 0 and "not found" in before.stderr, before

        reply = flows.nvcli_ok(
            node, "alice", "mount", "--name", pod, "--mount", "0", "--with-driver"
        )

        assert f"{LIB}/libnvidia-ml.so.{VERSION}" in json.dumps(reply), reply
        assert flows.device_state(node, pod) == GRANTED
        smi = _smi(node, pod)
        assert smi.returncode == 0, smi
        assert f"GPU 0: stand-in (UUID: {NVML_GPUS[0].uuid})" in smi.stdout
        link = node.kubectl("exec", pod, "--", "ls", "-l", f"{LIB}/libcuda.so").stdout
        assert link.strip().endswith("libcuda.so.1")  # the spec's create-symlinks, done
        wrote = node.kubectl(
            "exec", pod, "--", "sh", "-c", f"echo x > {LIB}/libcuda.so.{VERSION}", check=False
        )
        assert wrote.returncode != 0 and "Read-only" in wrote.stderr, wrote

        flows.nvcli_ok(node, "alice", "unmount", "--name", pod, "--unmount", "0")

        after = _smi(node, pod)
        assert after.returncode != 0 and "not found" in after.stderr, after
        listed = node.kubectl("exec", pod, "--", "ls", LIB, check=False).stdout.split()
        assert listed == [], listed
