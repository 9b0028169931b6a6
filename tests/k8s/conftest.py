"""The real-node tier: a single-node Kubernetes started once for the tests here.

HOTMOUNT_K8S_VERSION picks the stack: 1.37 (the default: v1.37.2, etcd 3.6, containerd 2,
from Go modules) or 1.20 (Debian's Kubernetes 1.20.2, etcd 3.4, containerd 1.6).
HOTMOUNT_K8S_DEVICE_PLUGIN picks who serves `nvidia.com/gpu`: `nvidia` (NVIDIA's own
k8s-device-plugin on the fake NVML, the default on 1.37) or `fake` (tests/k8s/deviceplugin,
the default on 1.20).

Marked `k8s`; run alone with `.venv/bin/pytest tests/k8s`. It needs root (a kubelet,
containerd, cgroups, veth, iptables): elsewhere it skips saying why, and under CI
it may not skip. The node is package-scoped: it is torn down before the next test
package runs, so it never shares the machine with the kernel tests' containers.

The agent is deployed as a user deploys it: the image from `scripts/build-image.sh`,
imported into the node's containerd, and `helm install` of the chart with values
only (the fake NVML through `extraVolumes`/`extraVolumeMounts`/`extraEnv`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fakes import nvml as fake_nvml
from tests.k8s import flows
from tests.k8s.deviceplugin import FakeGpuPlugin, nvidia
from tests.k8s.node import cluster
from tests.k8s.node.cluster import Node
from tests.k8s.notebook_image import REFERENCE, build_notebook_image
from tests.support.image import build_agent_image

WHY_NOT = cluster.missing_requirements()
TIMINGS: dict[str, float] = {}
KUBECTL_VERSION: list[str] = []


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    mine = [item for item in items if "tests/k8s" in str(item.fspath)]
    for item in mine:
        item.add_marker(pytest.mark.k8s)
    if not WHY_NOT or not mine:
        return
    if os.environ.get("CI"):
        raise pytest.UsageError(
            f"CI is set but {len(mine)} k8s tests cannot run ({WHY_NOT}); "
            "CI runs as root: fix the machine's setup, not the tests"
        )
    for item in mine:
        item.add_marker(pytest.mark.skip(reason=f"k8s tier: {WHY_NOT}"))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if TIMINGS:
        parts = ", ".join(f"{name} {seconds:.0f}s" for name, seconds in TIMINGS.items())
        terminalreporter.write_line(f"k8s tier: {parts}")
    for line in KUBECTL_VERSION:
        terminalreporter.write_line(f"k8s tier: kubectl version: {line}")


FAILED_SETUP: dict[str, str] = {}


class _Setup:
    """A package fixture's setup that failed once fails every later test at once.

    pytest would otherwise run it again for each test: minutes each (image, node).
    """

    def __init__(self, name: str) -> None:
        self.name = name
        if name in FAILED_SETUP:
            pytest.fail(f"{name} could not be set up (see the first error): {FAILED_SETUP[name]}")

    def __enter__(self) -> None:
        pass

    def __exit__(self, kind: type | None, error: BaseException | None, tb: object) -> None:
        if error is not None:
            FAILED_SETUP[self.name] = (
                str(error).splitlines()[0][:300] if str(error) else kind.__name__
            )  # type: ignore[union-attr]


class _Timer:
    def __init__(self, name: str) -> None:
        self.name = name

    def __enter__(self) -> None:
        self.start = time.monotonic()

    def __exit__(self, *exc: object) -> None:
        TIMINGS[self.name] = time.monotonic() - self.start


@pytest.fixture(scope="package")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    tier_start = time.monotonic()
    with _Setup("the k8s node"):
        with _Timer(f"kubernetes {cluster.stack_version()} build (cached after the first)"):
            stack = cluster.build_stack()
        with _Timer("agent image"):
            # the archive tests/deploy/test_image.py checked, if it ran first
            image = build_agent_image(tmp_path_factory.mktemp("image"))
        workdir = tmp_path_factory.mktemp("k8s-node")
        with _Timer("node up"):
            started = Node(workdir, stack, users=flows.PEOPLE).start()
    try:
        with _Setup("the k8s node"), _Timer("image import"):
            started.import_image(image.archive)
        started.image = image  # type: ignore[attr-defined]
        KUBECTL_VERSION[:] = started.kubectl("version", check=False).stdout.splitlines()
        yield started
    finally:
        with _Timer("teardown"):
            started.stop()
        TIMINGS["tier total"] = time.monotonic() - tier_start


@pytest.fixture(scope="package")
def gpus(node: Node, tmp_path_factory: pytest.TempPathFactory) -> Iterator[flows.Gpus]:
    """A device plugin and the fake NVML, with the same UUIDs."""
    plugin: FakeGpuPlugin | nvidia.NvidiaDevicePlugin
    with _Setup("the fake GPUs"):
        directory = tmp_path_factory.mktemp("fake-nvml")
        fake_nvml.build(directory)
        fake_nvml.write_config(directory / "gpus.conf", flows.NVML_GPUS)
        if nvidia.selected():
            with _Timer("nvidia-device-plugin build (cached after the first)"):
                binary = nvidia.build()
            plugin = nvidia.NvidiaDevicePlugin(binary, directory, flows.NVML_GPUS, node.workdir)
            plugin.start()
        else:
            plugin = FakeGpuPlugin([gpu.uuid for gpu in flows.NVML_GPUS]).start()
    try:
        with _Setup("the fake GPUs"):
            try:
                flows.wait_allocatable(node, len(flows.NVML_GPUS))
            except AssertionError as error:
                if isinstance(plugin, nvidia.NvidiaDevicePlugin):
                    raise AssertionError(f"{error}\n{plugin.log_tail()}") from None
                raise
        yield flows.Gpus(nvml_dir=Path(directory), plugin=plugin)
    finally:
        plugin.stop()


@pytest.fixture(scope="package")
def hotmount(node: Node, gpus: flows.Gpus) -> Iterator[flows.Release]:
    """The chart installed, the agent Ready, the APIService Available, the users bound."""
    with _Setup("the chart"), _Timer("helm install to Available"):
        release = flows.Release(node, gpus).install()
    try:
        yield release
    finally:
        release.uninstall()


@pytest.fixture(scope="package")
def notebook_image(node: Node, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The notebook image (tests/k8s/notebook_image.py) imported, once for flows 10 and 26."""
    with _Setup("the notebook image"), _Timer("notebook image"):
        image = node.image  # type: ignore[attr-defined]
        node.import_image(build_notebook_image(image.archive, tmp_path_factory.mktemp("notebook")))
    return REFERENCE
