"""What a DRA pin costs a mount by name (`python -m bench.pin_bench --dra`, issue 31).

Starts the real-node tier's cluster with the DRA example driver (tests/k8s/dradriver.py:
two GPUs published as `gpu.example.com`) and no device plugin; the fake NVML shows the
agent those two GPUs and a third that no one publishes. One pod with no GPU; as alice,
each `nvcli mount --name POD --mount UUID` and the `nvcli unmount --unmount UUID` after
it are timed, as new processes:

- **dra**: GPU 0, in the driver's ResourceSlice (BOOKS `dra`): the mount makes a
  ResourceClaim selecting that GPU by UUID and a pin pod using it, and waits until the
  pin is Running (the scheduler allocated the claim, the kubelet had the driver prepare
  it, containerd started the pin); the unmount deletes both.
- **unmanaged** (the baseline): the third GPU, in nobody's books: the same agent, pod
  and process, no pin. Each reply is checked for it (a pin named, or none).

The modes alternate in `--rounds` blocks, one untimed pair first in each. Prints p50/p99
per mode and the ratios dra / unmanaged. Nothing here asserts a time.
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

from bench.stats import percentile, summary
from tests.fakes import nvml as fake_nvml
from tests.fakes.nvml import FakeGpu
from tests.k8s import dradriver, flows
from tests.k8s.deviceplugin import FakeGpuPlugin
from tests.k8s.node import cluster
from tests.k8s.node.cluster import Node
from tests.support.image import build_agent_image

DRA, UNMANAGED = "dra", "unmanaged"
LONER = FakeGpu("GPU-0d0a0000-0000-4000-8000-00000000000a", "0000:af:00.0", 2)


def timed_nvcli(node: Node, *args: str) -> tuple[float, dict[str, object]]:
    started = time.perf_counter()
    result = flows.nvcli(node, "alice", *args, "-o", "json")
    took = time.perf_counter() - started
    if result.returncode != 0:
        raise RuntimeError(f"nvcli {' '.join(args)}: rc={result.returncode}\n{result.stderr}")
    return took, json.loads(result.stdout) if result.stdout.strip() else {}


def pair(node: Node, pod: str, uuid: str, pinned: bool) -> tuple[float, float]:
    mounted, reply = timed_nvcli(node, "mount", "--name", pod, "--mount", uuid)
    pins = [m.get("pin") for m in reply["mounted"]]  # type: ignore[union-attr]
    if pinned != bool(pins[0]):
        raise RuntimeError(f"mount of {uuid}: the reply's pin is {pins[0]!r}")
    unmounted, _ = timed_nvcli(node, "unmount", "--name", pod, "--unmount", uuid)
    return mounted, unmounted


def main(iterations: int, rounds: int, machine: str) -> int:
    work = Path(tempfile.mkdtemp(prefix="pin-bench-dra-"))
    started = time.monotonic()
    stack = cluster.build_stack()
    (work / "image").mkdir()
    image = build_agent_image(work / "image")
    node = Node(work / "node", stack, users=flows.PEOPLE).start()
    release: flows.Release | None = None
    samples: dict[str, dict[str, list[float]]] = {
        mode: {"mount": [], "unmount": [], "pair": []} for mode in (DRA, UNMANAGED)
    }
    try:
        node.import_image(image.archive)
        node.image = image  # type: ignore[attr-defined]
        published = dradriver.start(node)
        nvml = work / "fake-nvml"
        fake_nvml.build(nvml)
        fake_nvml.write_config(nvml / "gpus.conf", [*(g.nvml() for g in published), LONER])
        gpus = flows.Gpus(nvml_dir=nvml, plugin=FakeGpuPlugin([]))  # never started
        release = flows.Release(node, gpus, dra=dradriver.VALUES).install()
        print(f"cluster up in {time.monotonic() - started:.0f}s", flush=True)
        targets = {DRA: published[0].uuid, UNMANAGED: LONER.uuid}
        pod = flows.new_name("bench")
        with flows.running_pod(node, flows.pod_manifest(pod)):
            per_block = max(1, iterations // rounds)
            for block in range(rounds):
                for mode in (DRA, UNMANAGED):
                    pair(node, pod, targets[mode], mode == DRA)  # untimed: caches
                    for _ in range(per_block):
                        mounted, unmounted = pair(node, pod, targets[mode], mode == DRA)
                        samples[mode]["mount"].append(mounted)
                        samples[mode]["unmount"].append(unmounted)
                        samples[mode]["pair"].append(mounted + unmounted)
                    print(f"block {block + 1}/{rounds} {mode}: done", flush=True)
    finally:
        if release is not None:
            release.uninstall()
        node.stop()
    print(f"{machine}; stack {stack.release}, containerd {stack.containerd_release}")
    for mode in (DRA, UNMANAGED):
        for what, values in samples[mode].items():
            print(summary(f"{mode}: nvcli {what}", values))
    for what in ("mount", "unmount", "pair"):
        dra, unmanaged = samples[DRA][what], samples[UNMANAGED][what]
        ratios = [percentile(dra, q) / percentile(unmanaged, q) for q in (50, 99)]
        extra = (percentile(dra, 50) - percentile(unmanaged, 50)) * 1000
        print(
            f"{what:<8} dra / unmanaged: p50 {ratios[0]:.2f}x  p99 {ratios[1]:.2f}x  "
            f"(p50 +{extra:.0f} ms for the claim and its pin)"
        )
    return 0
