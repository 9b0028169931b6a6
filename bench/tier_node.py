"""The real-node tier's cluster for a bench: Kubernetes 1.37 from tests/k8s/node, the
agent's image, the chart installed with values only, the fake device plugin and NVML
with the tier's two GPUs, and one pod with GPU 0 hot-mounted (by `alice`, a
`hotmount-user`). Torn down on the way out, also after a failure.

Run it under the tier's lock: it claims the kubelet's paths, ports and a bridge.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tests.fakes import nvml as fake_nvml
from tests.k8s import flows
from tests.k8s.deviceplugin import FakeGpuPlugin
from tests.k8s.node import cluster
from tests.k8s.node.cluster import Node
from tests.support.image import build_agent_image

USER = "alice"


@dataclass(frozen=True)
class TierPod:
    node: Node
    namespace: str
    pod: str

    @property
    def kubeconfig(self) -> Path:
        """The user's kubeconfig: what `nvcli` and `kubectl` are both given."""
        return self.node.kubeconfigs[USER]


@contextmanager
def tier_pod() -> Iterator[TierPod]:
    why_not = cluster.missing_requirements()
    if why_not:
        raise SystemExit(f"the real-node tier: {why_not}")
    work = Path(tempfile.mkdtemp(prefix="tier-bench-"))
    stack = cluster.build_stack()
    (work / "image").mkdir()
    image = build_agent_image(work / "image")
    node = Node(work / "node", stack, users=flows.PEOPLE).start()
    plugin: FakeGpuPlugin | None = None
    release: flows.Release | None = None
    try:
        node.import_image(image.archive)
        node.image = image  # type: ignore[attr-defined]
        nvml = work / "fake-nvml"
        nvml.mkdir()
        fake_nvml.build(nvml)
        fake_nvml.write_config(nvml / "gpus.conf", flows.NVML_GPUS)
        plugin = FakeGpuPlugin([gpu.uuid for gpu in flows.NVML_GPUS]).start()
        release = flows.Release(node, flows.Gpus(nvml_dir=nvml, plugin=plugin)).install()
        name = flows.new_name("bench")
        with flows.running_pod(node, flows.pod_manifest(name)):
            flows.nvcli_ok(node, USER, "mount", "--name", name, "--mount", "0")
            yield TierPod(node, "default", name)
    finally:
        if release is not None:
            release.uninstall()
        if plugin is not None:
            plugin.stop()
        node.stop()
