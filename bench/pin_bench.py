"""What the pin costs a mount by name: `nvcli mount --mount 0` and `nvcli unmount` on a
real single-node Kubernetes 1.20, with and without the scheduler's books to keep.

    sudo flock /tmp/k8s-tier.lock .venv/bin/python -m bench.pin_bench [--iterations 10]

Starts the real-node tier's cluster (tests/k8s: the node, the agent image, the fake
device plugin and fake NVML with the same two GPUs, the chart installed with Helm), one
pod with no GPU, and times, as alice with her kubeconfig, each `nvcli mount --name POD
--mount 0` and the `nvcli unmount --name POD --unmount 0` after it, as new processes:

- **pinned**: the fake device plugin advertises both GPUs, so GPU 0 is the device
  plugin's (the BOOKS column says `device-plugin`): the mount makes a pin (a 1-GPU
  scout for each free GPU, keeps the one the kubelet gave GPU 0, deletes the other,
  waiting for it to be Running), and the unmount deletes the pin and waits until it is
  gone;
- **unmanaged** (the baseline): the same agent, the same pod and GPU, in the same
  process, with the fake device plugin stopped. The kubelet then counts no allocatable
  `nvidia.com/gpu` (its devices unhealthy), so the agent finds the GPU in nobody's
  books (`unmanaged`) and mounts it with no pin: exactly the mount without the
  accounting step. Each reply is checked for it (a pin named, or none).

The two modes alternate in `--rounds` blocks (the plugin stopped and started again in
between, waiting for the node's allocatable to follow), so a change in the machine's
load falls on both; one untimed pair first in each block. Prints p50/p99 of mount,
unmount and the pair per mode, the ratios pinned / unmanaged, and the machine; and, as
a reference for what the pin's cost is made of, the time two scout-like pods (pause
image, one GPU each, Guaranteed) created together by kubectl take to be Running.
Nothing here asserts a time: these machines are shared and noisy.

Notes (one run, 2 vCPUs shared, load ~0.7, 10 pairs per mode in 2 blocks): mount
pinned p50 4826 ms / p99 5732 ms, unmanaged 234 / 310 ms: 20.6x (+4.6 s); unmount
244 / 227 ms: 1.08x (a pin has a grace period of 0, so the API server deletes it at
once); two scout-like pods to Running by kubectl 4875 ms p50: the pin's cost is the
kubelet starting the scouts (sandboxes, CNI), not the agent. It grows with the number
of free GPUs, one scout each.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

from bench.stats import percentile, summary
from tests.fakes import nvml as fake_nvml
from tests.k8s import flows
from tests.k8s.deviceplugin import FakeGpuPlugin
from tests.k8s.node import cluster
from tests.k8s.node.cluster import NODE_NAME, Node
from tests.support.image import build_agent_image

PINNED, UNMANAGED = "pinned", "unmanaged"


def machine() -> str:
    model = "?"
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            model = line.split(":", 1)[1].strip()
            break
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    return (
        f"{platform.node()}: {os.cpu_count()} CPUs ({model}), kernel {platform.release()}, "
        f"Kubernetes 1.20.2 single node, load {load}"
    )


def allocatable(node: Node) -> int:
    found = json.loads(node.kubectl("get", "node", NODE_NAME, "-o", "json").stdout)
    return int(found["status"].get("allocatable", {}).get(flows.GPU_RESOURCE, "0"))


class Plugin:
    """The fake device plugin, which can be stopped and started again."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self.running: FakeGpuPlugin | None = None

    def start(self) -> None:
        if self.running is None:
            self.running = FakeGpuPlugin([gpu.uuid for gpu in flows.NVML_GPUS]).start()
        flows.wait_for("2 allocatable GPUs", lambda: allocatable(self.node) == 2, 120)

    def stop(self) -> None:
        if self.running is not None:
            self.running.stop()
            self.running = None
        flows.wait_for("no allocatable GPU", lambda: allocatable(self.node) == 0, 120)


def timed_nvcli(node: Node, *args: str) -> tuple[float, dict[str, object]]:
    started = time.perf_counter()
    result = flows.nvcli(node, "alice", *args, "-o", "json")
    took = time.perf_counter() - started
    if result.returncode != 0:
        raise RuntimeError(f"nvcli {' '.join(args)}: rc={result.returncode}\n{result.stderr}")
    return took, json.loads(result.stdout) if result.stdout.strip() else {}


def pair(node: Node, pod: str, mode: str) -> tuple[float, float]:
    mounted, reply = timed_nvcli(node, "mount", "--name", pod, "--mount", "0")
    pins = [m.get("pin") for m in reply["mounted"]]  # type: ignore[union-attr]
    if (mode == PINNED) != bool(pins[0]):
        raise RuntimeError(f"{mode} mount, but the reply's pin is {pins[0]!r}")
    unmounted, _ = timed_nvcli(node, "unmount", "--name", pod, "--unmount", "0")
    if mode == PINNED and flows.pins(node, pod):
        raise RuntimeError("the pin outlived the unmount")
    return mounted, unmounted


def two_scouts(node: Node) -> float:
    """The kubelet's floor under a pin: two pods like the scouts (the pause image, one
    GPU each, Guaranteed, grace 0) created at once, until both are Running (polled every
    0.2 s, as the agent does); then deleted. kubectl's own start is in it (~0.1 s/call)."""
    names = [flows.new_name("scout") for _ in range(2)]
    manifests = []
    for name in names:
        manifest = flows.gpu_pod_manifest(name, 1, image=cluster.PAUSE_IMAGE)
        container = manifest["spec"]["containers"][0]
        del container["command"]
        amounts = {flows.GPU_RESOURCE: "1", "cpu": "10m", "memory": "16Mi"}
        container["resources"] = {"limits": amounts, "requests": dict(amounts)}
        manifests.append(manifest)
    started = time.perf_counter()
    node.apply(manifests)

    def running() -> bool:
        found = node.kubectl("get", "pods", *names, "-o", "json").stdout
        return all(p["status"].get("phase") == "Running" for p in json.loads(found)["items"])

    flows.wait_for("both scouts are Running", running, 60, every=0.2)
    took = time.perf_counter() - started
    for name in names:
        flows.delete_pod(node, name)
    return took


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--iterations", type=int, default=10, help="timed pairs per mode")
    parser.add_argument("--rounds", type=int, default=2, help="blocks per mode, alternating")
    parser.add_argument(
        "--dra", action="store_true", help="a DRA pin vs an unmanaged GPU (bench/pin_bench_dra.py)"
    )
    args = parser.parse_args()
    why_not = cluster.missing_requirements()
    if why_not:
        sys.exit(f"pin_bench: {why_not}")
    print(machine(), flush=True)
    if args.dra:
        from bench import pin_bench_dra

        return pin_bench_dra.main(args.iterations, args.rounds, machine())
    work = Path(tempfile.mkdtemp(prefix="pin-bench-"))
    started = time.monotonic()
    stack = cluster.build_stack()  # HOTMOUNT_K8S_VERSION, as the tier
    (work / "image").mkdir()
    image = build_agent_image(work / "image")
    node = Node(work / "node", stack, users=flows.PEOPLE).start()
    plugin = Plugin(node)
    release: flows.Release | None = None
    samples: dict[str, dict[str, list[float]]] = {
        mode: {"mount": [], "unmount": [], "pair": []} for mode in (PINNED, UNMANAGED)
    }
    scouts: list[float] = []
    try:
        node.import_image(image.archive)
        node.image = image  # type: ignore[attr-defined]
        nvml = work / "fake-nvml"
        nvml.mkdir()
        fake_nvml.build(nvml)
        fake_nvml.write_config(nvml / "gpus.conf", flows.NVML_GPUS)
        plugin.start()
        assert plugin.running is not None
        release = flows.Release(node, flows.Gpus(nvml_dir=nvml, plugin=plugin.running)).install()
        print(f"cluster up in {time.monotonic() - started:.0f}s", flush=True)
        pod = flows.new_name("bench")
        with flows.running_pod(node, flows.pod_manifest(pod)):
            per_block = max(1, args.iterations // args.rounds)
            for block in range(args.rounds):
                for mode in (PINNED, UNMANAGED):
                    if mode == PINNED:
                        plugin.start()
                    else:
                        plugin.stop()
                    pair(node, pod, mode)  # untimed: the agent's and the CLI's caches
                    for _ in range(per_block):
                        mounted, unmounted = pair(node, pod, mode)
                        samples[mode]["mount"].append(mounted)
                        samples[mode]["unmount"].append(unmounted)
                        samples[mode]["pair"].append(mounted + unmounted)
                    if mode == PINNED:
                        scouts += [two_scouts(node) for _ in range(per_block)]
                    print(f"block {block + 1}/{args.rounds} {mode}: done", flush=True)
    finally:
        if release is not None:
            release.uninstall()
        if plugin.running is not None:
            plugin.running.stop()
        node.stop()
    print(machine())
    for mode in (PINNED, UNMANAGED):
        for what, values in samples[mode].items():
            print(summary(f"{mode}: nvcli {what}", values))
    print(summary("reference: 2 scout-like pods to Running", scouts))
    for what in ("mount", "unmount", "pair"):
        pinned, unmanaged = samples[PINNED][what], samples[UNMANAGED][what]
        ratios = [percentile(pinned, q) / percentile(unmanaged, q) for q in (50, 99)]
        extra = (percentile(pinned, 50) - percentile(unmanaged, 50)) * 1000
        print(
            f"{what:<8} pinned / unmanaged: p50 {ratios[0]:.2f}x  p99 {ratios[1]:.2f}x  "
            f"(p50 +{extra:.0f} ms for the pin)"
        )
    floor = percentile(scouts, 50) / (
        percentile(samples[PINNED]["mount"], 50) - percentile(samples[UNMANAGED]["mount"], 50)
    )
    print(f"the kubelet starting 2 scout-like pods is {floor:.0%} of the pin's p50 cost")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
