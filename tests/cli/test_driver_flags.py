"""`nvcli mount --with-driver` and `%gpu attach` with the driver's files (issue 19):
what is sent, and against a real agent whose --driver-root is the stand-in driver
(tests/fakes/driver), what is printed to export and what lands in os.environ.

The pod is busybox alone, with no glibc: the agent then puts the soname links beside
the libraries and returns LD_LIBRARY_PATH, so there is an environment to carry. Each
pod has a rootfs of its own: the mount points made in it must not reach other tests."""

from __future__ import annotations

import io
import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from cli import notebook
from cli.notebook import Config, environment_after
from tests.agent.conftest import ALICE, DANA
from tests.agent.conftest import Cluster as RealCluster
from tests.cli.conftest import AGENT_TOKEN, Run
from tests.cli.stub_agent import StubAgent
from tests.fakes import driver as stand_in
from tests.fakes import nvml
from tests.support.agent import pod_manifest
from tests.support.runc import RuncContainer, make_rootfs

Nvcli = Callable[..., Run]
MOUNT = ["mount", "--name", "nb-0", "--mount", "0"]
LIB = stand_in.LIB_DIR
needs_gcc = pytest.mark.skipif(nvml.gcc() is None, reason="gcc builds the stand-in driver")


def agent_args(url: str, token: str = AGENT_TOKEN, namespace: str = "ml") -> list[str]:
    return ["--agent", url, "--token", token, "-n", namespace]


@pytest.mark.parametrize(
    ("flags", "sent"),
    [(["--with-driver"], {"withDriver": True}), (["--without-driver"], {"withDriver": False})],
    ids=["with", "without"],
)
def test_the_request_body(nvcli: Nvcli, stub: StubAgent, flags: list[str], sent: dict) -> None:
    run = nvcli(*MOUNT, *flags, *agent_args(stub.url))
    assert run.rc == 0, run.err
    (req,) = stub.received
    assert req.body == {"devices": ["0"], "force": False, **sent}


def test_not_with_local(nvcli: Nvcli) -> None:
    run = nvcli("mount", "--local", "--container", "a" * 64, "--mount", "0", "--with-driver")
    assert run.rc == 2 and "--with-driver works on pods" in run.err


@pytest.mark.parametrize(
    ("edits", "current", "expected"),
    [
        ({"LD_LIBRARY_PATH": "/d"}, {}, {"LD_LIBRARY_PATH": "/d"}),
        ({"LD_LIBRARY_PATH": "/d"}, {"LD_LIBRARY_PATH": "/a:/d:/b"},
         {"LD_LIBRARY_PATH": "/d:/a:/b"}),
        ({"NVIDIA_VISIBLE_DEVICES": "void"}, {"NVIDIA_VISIBLE_DEVICES": "all"},
         {"NVIDIA_VISIBLE_DEVICES": "void"}),
    ],
    ids=["new", "search-path-first", "plain-replaced"],
)  # fmt: skip
def test_environment_after_keeps_what_a_search_path_had(
    edits: dict[str, str], current: dict[str, str], expected: dict[str, str]
) -> None:
    assert environment_after(edits, current) == expected


def own_pod(real: RealCluster, name: str = "nb") -> RuncContainer:
    container = RuncContainer(real.workdir, make_rootfs(real.workdir / f"image-{name}"), "v1")
    real.containers.append(container)
    real.kube.put_pod(pod_manifest(name, container))
    return container


@pytest.fixture(scope="module")
def driver_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return stand_in.build_root(tmp_path_factory.mktemp("driver"))


@pytest.mark.kernel
@needs_gcc
def test_nvcli_prints_what_to_export_and_json_carries_it(
    nvcli: Nvcli, real: RealCluster, driver_root: Path
) -> None:
    container = own_pod(real)
    agent = real.agent(extra=["--driver-root", str(driver_root), "--inject-driver", "always"])
    args = agent_args(agent.url, ALICE, "default")

    mounted = nvcli("mount", "--name", "nb", "--mount", "0", "--with-driver", *args)

    assert mounted.rc == 0, mounted.err
    assert "driver files added: " in mounted.out
    assert f"from driver root {driver_root}" in mounted.out
    assert f"  export LD_LIBRARY_PATH={LIB}" in mounted.out.splitlines()
    assert container.exec("ls", "/usr/bin/nvidia-smi").returncode == 0

    unmounted = nvcli("unmount", "--name", "nb", "--unmount", "0", *args)
    assert unmounted.rc == 0, unmounted.err
    assert "driver files removed: " in unmounted.out
    assert container.exec("ls", "/usr/bin/nvidia-smi").returncode != 0

    as_json = nvcli("mount", "--name", "nb", "--mount", "0", "--with-driver", "-o", "json", *args)
    assert as_json.rc == 0, as_json.err
    driver = as_json.json()["driver"]  # type: ignore[index]
    assert driver["env"] == {"LD_LIBRARY_PATH": LIB}
    assert "/usr/bin/nvidia-smi" in driver["files"]


@pytest.mark.kernel
@needs_gcc
def test_gpu_attach_sets_the_environment_for_the_kernels_subprocesses(
    real: RealCluster, tmp_path: Path, driver_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """%gpu attach leaves withDriver to the node (auto by default): this image has no
    libcuda.so.1, so the files come, and LD_LIBRARY_PATH reaches a subprocess."""
    monkeypatch.setenv("LD_LIBRARY_PATH", "/opt/mine")  # restored after the test
    container = own_pod(real)
    agent = real.agent(extra=["--driver-root", str(driver_root)])
    sa = tmp_path / "sa"
    sa.mkdir()
    (sa / "token").write_text(DANA)
    (sa / "namespace").write_text("default")
    config = Config.from_env({"HOSTNAME": "nb", "GPU_HOTMOUNT_AGENT": agent.url}, sa)
    out, err = io.StringIO(), io.StringIO()

    ok = notebook.magic("attach 0", config, out, err)

    assert ok, err.getvalue()
    assert "with the driver's files" in out.getvalue()
    assert "LD_LIBRARY_PATH set for subprocesses" in out.getvalue()
    assert os.environ["LD_LIBRARY_PATH"] == f"{LIB}:/opt/mine"
    child = subprocess.run(
        ["sh", "-c", "echo $LD_LIBRARY_PATH"], check=True, capture_output=True, text=True
    )
    assert child.stdout.strip() == f"{LIB}:/opt/mine"
    assert container.exec("ls", "/usr/bin/nvidia-smi").returncode == 0
