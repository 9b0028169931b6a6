"""What the pin costs a mount by name, with 2 and with 8 GPUs on the node: `nvcli mount
--mount 0` on the real single-node Kubernetes of the tier (tests/k8s), with and without
the scheduler's books to keep, in one run.

    cd /work/wt-NAME && flock /work/k8s-tier.lock .venv/bin/python -m bench.pin_bench

Starts the tier's cluster (HOTMOUNT_K8S_VERSION, as the tier: 1.37 by default; the
agent image, the fake NVML with 8 GPUs, the chart installed with Helm), one pod with no
GPU, and times, as alice with her kubeconfig, `nvcli mount --name POD --mount 0` and the
unmount after it, as new processes, in three modes that alternate in `--rounds` blocks
(so a change in the machine's load falls on all of them):

- **pinned, 2 GPUs**: the fake device plugin advertises GPUs 0 and 1: the mount makes a
  pin (a blocker in the agent's namespace per free GPU, the blocker given GPU 0 deleted,
  the tenant's pin given GPU 0 in its place, decided when the kubelet admits, not when
  anything runs);
- **pinned, 8 GPUs**: the plugin advertises all eight (eight blockers);
- **unmanaged** (the baseline): the plugin stopped, so the kubelet counts no
  allocatable `nvidia.com/gpu` and GPU 0 is in nobody's books: the same mount with no pin.
  Each reply is checked for its mode (a pin named, or none).

For each mount it takes three times from the moment nvcli is started:
- **reply**: nvcli has returned (the mount is complete, books included);
- **device open**: a shell loop in the pod opens /dev/nvidia0 and gets ENXIO (granted,
  no driver) instead of EPERM or no node; it reads /proc/uptime, the same clock as the
  bench's CLOCK_BOOTTIME (10 ms steps);
- **books right** (pinned modes): PodResources lists the pod's pin holding GPU 0 and no
  blocker holding anything (read every 25 ms on the kubelet's socket: the kubelet
  allows 100 reads a second, the agent's included).

Prints p50/p99 per mode, the ratios to the unmanaged mount, and the machine's load
before and after. Nothing here asserts a time: these machines are shared and noisy.
`PIN_BENCH_AGENT_LOG=FILE` writes the agent's log there before the cluster goes (its
access log has each request's `durationMs`, the agent's own share of the reply).

Notes (one run on 2026-11-25, Kubernetes 1.37, 2 shared vCPUs, load 2.4 at the start and
6 to 18 during the run, 20 mounts per mode in 2 blocks), p50 / p99:

    mode             reply              device open        books right
    pinned, 2 GPUs   780 / 1022 ms      651 / 831 ms       636 / 797 ms
    pinned, 8 GPUs   1639 / 2919 ms     1439 / 2447 ms     1421 / 2465 ms
    unmanaged        336 / 438 ms       278 / 369 ms       -

Reply ratios to the unmanaged mount: 2.32x (2 GPUs) and 4.88x (8 GPUs) at p50; p99/p50
1.31 and 1.78. Before issue 32 (scouts waited on until Running, 1.20): 4.8 s p50 with 2
GPUs, 20.6x. A first run found the kubelet's PodResources rate limit (100 calls a
second for all clients): this bench read it every 5 ms and the agent every 20 ms.

2026-11-28 (issue 42, 10 mounts per mode in 2 blocks, load 0.7 to 1.5 at the start and
10 to 14 at the end), main against the blockers deleted a moment after the pin holds its
GPU (a63e827), in both orders, reply p50: 2 GPUs 948 -> 631 and 671 -> 719 ms, 8 GPUs
2018 -> 1339 and 1247 -> 1253 ms; the agent's own share 374 -> 213 and 272 -> 230 ms,
872 -> 540 and 782 -> 546 ms; books right comes after the reply with 2 GPUs (the
blockers linger 0.25 s). The breakdown per step and every pair: docs/benchmarks.md.
The shell loop that times the device open forks every 2 ms in the pod: it is part of
the load the mounts see, the same for every mode and tree.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from agent.podresources.client import PodResourcesClient
from bench.stats import percentile, summary
from tests.fakes import nvml as fake_nvml
from tests.fakes.nvml import FakeGpu
from tests.k8s import flows
from tests.k8s.deviceplugin import FakeGpuPlugin
from tests.k8s.node import cluster
from tests.k8s.node.cluster import NODE_NAME, Node
from tests.support.image import build_agent_image

PINNED_2, PINNED_8, UNMANAGED = "pinned, 2 GPUs", "pinned, 8 GPUs", "unmanaged"
MODES = (PINNED_2, PINNED_8, UNMANAGED)
ADVERTISED = {PINNED_2: 2, PINNED_8: 8, UNMANAGED: 0}
# GPUs 0 and 1 are the tier's; six more behind them in PCI order (index = bus order).
GPUS = (
    *flows.NVML_GPUS,
    *(FakeGpu(f"GPU-4b8d0c3e-0000-4000-8000-00000000000{i}", f"0000:{0x40 + i:02x}:00.0", i)
      for i in range(2, 8)),
)  # fmt: skip
SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
BLOCKER = "hotmount-blocker-"
# In the pod: wait until /dev/nvidia0 opens with ENXIO (granted, no driver), then say when.
OPEN_LOOP = (
    "echo ready; while :; do if [ -c /dev/nvidia0 ] && (exec 3<>/dev/nvidia0) 2>&1 "
    "| grep -q 'No such device'; then cut -d' ' -f1 /proc/uptime; exit 0; fi; usleep 2000; done"
)


def machine() -> str:
    model = "?"
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            model = line.split(":", 1)[1].strip()
            break
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    return (
        f"{platform.node()}: {os.cpu_count()} CPUs ({model}), kernel {platform.release()}, "
        f"Kubernetes {cluster.stack_version()} single node, load {load}"
    )


def boottime() -> float:
    return time.clock_gettime(time.CLOCK_BOOTTIME)


def allocatable(node: Node) -> int:
    found = json.loads(node.kubectl("get", "node", NODE_NAME, "-o", "json").stdout)
    return int(found["status"].get("allocatable", {}).get(flows.GPU_RESOURCE, "0"))


class Plugin:
    """The fake device plugin, advertising the first `count` GPUs (0: stopped)."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self.running: FakeGpuPlugin | None = None
        self.count = 0

    def advertise(self, count: int) -> None:
        if count != self.count and self.running is not None:
            self.running.stop()
            self.running = None
        if count and self.running is None:
            self.running = FakeGpuPlugin([gpu.uuid for gpu in GPUS[:count]]).start()
        self.count = count
        flows.wait_for(
            f"{count} allocatable GPUs", lambda: allocatable(self.node) == count, 120, every=0.2
        )


class BooksWatch(threading.Thread):
    """The first moment PodResources lists the pod's pin with GPU 0 and no blocker."""

    def __init__(self, pod: str) -> None:
        super().__init__(daemon=True)
        self.pod, self.at, self.done = pod, 0.0, threading.Event()

    def run(self) -> None:
        prefix = f"hotmount-pin-{self.pod}-"
        with PodResourcesClient(SOCKET) as client:
            while not self.done.is_set():
                allocations = [
                    a for a in client.list_allocations() if a.resource_name == flows.GPU_RESOURCE
                ]
                pinned = any(
                    a.pod_name.startswith(prefix) and GPUS[0].uuid in a.device_ids
                    for a in allocations
                )
                blocked = any(a.pod_name.startswith(BLOCKER) and a.device_ids for a in allocations)
                if pinned and not blocked:
                    self.at = boottime()
                    return
                time.sleep(0.025)


def one_mount(node: Node, pod: str, mode: str) -> dict[str, float]:
    """Mount GPU 0 and unmount it; the times of each step from nvcli's start."""
    kubectl = [node.stack.kubectl, "--kubeconfig", str(node.kubeconfigs["admin"]),
               "exec", pod, "--", "sh", "-c", OPEN_LOOP]  # fmt: skip
    opener = subprocess.Popen(kubectl, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert opener.stdout is not None
    if opener.stdout.readline().strip() != "ready":
        opener.kill()
        raise RuntimeError(f"the open loop did not start: {opener.communicate()[1]}")
    books = BooksWatch(pod)
    books.start()
    started = boottime()
    result = flows.nvcli(node, "alice", "mount", "--name", pod, "--mount", "0", "-o", "json")
    replied = boottime()
    try:
        if result.returncode != 0:
            raise RuntimeError(f"mount: rc={result.returncode}\n{result.stderr}")
        pin = json.loads(result.stdout)["mounted"][0].get("pin")
        if (mode != UNMANAGED) != bool(pin):
            raise RuntimeError(f"{mode} mount, but the reply's pin is {pin!r}")
        out, _ = opener.communicate(timeout=60)
        opened = float(out.split()[0])
        if mode != UNMANAGED:
            books.join(60)
    finally:
        books.done.set()
        opener.kill()
        opener.wait()
    took = {"reply": replied - started, "device open": opened - started}
    if mode != UNMANAGED:
        if not books.at:
            raise RuntimeError("PodResources never showed the pin alone holding GPU 0")
        took["books right"] = books.at - started
    unmount_start = time.perf_counter()
    flows.nvcli_ok(node, "alice", "unmount", "--name", pod, "--unmount", "0")
    took["unmount"] = time.perf_counter() - unmount_start
    if flows.pins(node, pod):
        raise RuntimeError("the pin outlived the unmount")
    return took


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--iterations", type=int, default=20, help="timed mounts per mode")
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
    stack = cluster.build_stack()
    (work / "image").mkdir()
    image = build_agent_image(work / "image")
    node = Node(work / "node", stack, users=flows.PEOPLE).start()
    plugin = Plugin(node)
    release: flows.Release | None = None
    samples: dict[str, dict[str, list[float]]] = {mode: {} for mode in MODES}
    try:
        node.import_image(image.archive)
        node.image = image  # type: ignore[attr-defined]
        nvml = work / "fake-nvml"
        nvml.mkdir()
        fake_nvml.build(nvml)
        fake_nvml.write_config(nvml / "gpus.conf", GPUS)
        plugin.advertise(2)
        assert plugin.running is not None
        release = flows.Release(node, flows.Gpus(nvml_dir=nvml, plugin=plugin.running)).install()
        print(f"cluster up in {time.monotonic() - started:.0f}s", flush=True)
        pod = flows.new_name("bench")
        with flows.running_pod(node, flows.pod_manifest(pod)):
            per_block = max(1, args.iterations // args.rounds)
            for block in range(args.rounds):
                for mode in MODES:
                    plugin.advertise(ADVERTISED[mode])
                    one_mount(node, pod, mode)  # untimed: the agent's and the CLI's caches
                    for _ in range(per_block):
                        for what, took in one_mount(node, pod, mode).items():
                            samples[mode].setdefault(what, []).append(took)
                    print(f"block {block + 1}/{args.rounds} {mode}: done ({machine()})", flush=True)
    finally:
        if os.environ.get("PIN_BENCH_AGENT_LOG") and release is not None:
            logs = node.kubectl(
                "logs",
                "-n",
                flows.NAMESPACE,
                "-l",
                "app.kubernetes.io/name=gpu-hotmount",
                "--tail=-1",
                check=False,
            )
            Path(os.environ["PIN_BENCH_AGENT_LOG"]).write_text(logs.stdout + logs.stderr)
        if release is not None:
            release.uninstall()
        if plugin.running is not None:
            plugin.running.stop()
        node.stop()
    print(machine())
    for mode in MODES:
        for what, values in samples[mode].items():
            print(summary(f"{mode}: {what}", values))
    base = samples[UNMANAGED]
    for mode in (PINNED_2, PINNED_8):
        for what in ("reply", "device open"):
            mine = samples[mode][what]
            ratios = [percentile(mine, q) / percentile(base[what], q) for q in (50, 99)]
            extra = (percentile(mine, 50) - percentile(base[what], 50)) * 1000
            spread = percentile(mine, 99) / percentile(mine, 50)
            print(
                f"{mode}: {what:<12} / unmanaged: p50 {ratios[0]:.2f}x  p99 {ratios[1]:.2f}x  "
                f"(p50 +{extra:.0f} ms for the pin; p99/p50 {spread:.2f})"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
