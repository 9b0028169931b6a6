"""On-demand GPUs under a replayed notebook workload (issue 42): N notebooks share M GPUs.

    .venv/bin/python -m bench.on_demand_bench --notebooks 16 --gpus 4
    .venv/bin/python -m bench.on_demand_bench --notebooks 32 --gpus 4

What runs: the agent as a real process against the fake API server and kubelet
(tests/agent/conftest.py's Cluster), real runc containers, one per notebook pod
(annotated `hotmount.io/gpu-on-demand`), each with the stand-in CUDA process
(tests/fakes/driver/cuda_process.c) holding a known pattern as its GPU memory, and the
stand-in libcuda, whose every checkpoint and restore costs `--gib` x `--cost-per-gib`
seconds (FAKE_CUDA_STEP_MS). Root and runc are needed.

Each notebook is a thread that does what the notebook extension does
(cli/notebook/ondemand.py): acquire before a cell (polled until attached), the cell,
release after it; then the user thinks. The workload (seeded, `--seed`):
- think time: exponential, mean `--think` seconds (default 30), clipped to [2, 4 x mean];
- cells: short ones uniform in [0.5, 3] s; with probability `--long-share` (default 0.1)
  a long "training" cell uniform in [15, 30] s;
- each notebook starts after a uniform delay in [0, mean think] and stops starting cells
  after `--minutes`.
The times are compressed against real use (think times of minutes), which makes the
test harder: more cells per GPU-hour, so more hand-overs.

It prints: the GPU-seconds the notebooks held attached (the agent's
hotmount_ondemand_gpu_seconds_total) against dedicated GPUs (notebooks x wall time), the
cells run, failed, and kernels whose pattern was lost, the wait per cell (p50/p99, and
the wait added on top of the stand-in's restore cost), each namespace's mean and longest
wait and its ratio to the overall mean, and the machine's load. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import statistics
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench.stats import percentile
from tests.agent.conftest import METRICS
from tests.fakes import nvml
from tests.support.cuda_standin import (
    MORE_NODES,
    build_standin,
    gpu_map,
    standin_uuids,
    start_cuda,
    status,
)
from tests.support.runc import RuncContainer
from tests.support.suspend_world import World

ANNOTATION = "hotmount.io/gpu-on-demand"
IDLE = "hotmount.io/gpu-on-demand-idle"


@dataclass
class Cell:
    namespace: str
    wait: float  # seconds from the first acquire to attached
    resumed: bool
    ok: bool  # the kernel's pattern intact on its GPU
    asked: float = 0.0  # monotonic times: the first acquire, attached, the release
    attached: float = 0.0
    ended: float = 0.0
    contended: bool = False  # every GPU ran another notebook's cell at some point of the wait


@dataclass
class Results:
    cells: list[Cell] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


def notebook(
    world: World, name: str, namespace: str, container: RuncContainer, args: argparse.Namespace,
    results: Results, until: float, rng: random.Random, token: str,
) -> None:  # fmt: skip
    """One notebook's cells, as the extension asks for them, with its pod's own token."""
    uuids = standin_uuids(args.gpus)
    started = False
    time.sleep(rng.uniform(0, args.think))
    path = f"/v1/namespaces/{namespace}/pods/{name}"
    with world.agent.client(token) as api:
        while time.monotonic() < until:
            long = rng.random() < args.long_share
            run = rng.uniform(15, 30) if long else rng.uniform(0.5, 3)
            asked = time.monotonic()
            try:
                while True:
                    got = api.post(f"{path}/acquire", json={"waitSeconds": 20})
                    if got.status_code != 200:
                        raise RuntimeError(f"acquire: {got.status_code} {got.text}")
                    answer = got.json()
                    if answer["state"] == "attached":
                        break
                    time.sleep(answer.get("retryAfterSeconds") or 0)
                wait = time.monotonic() - asked
                if not started:
                    first = next(u for u in uuids if answer["devices"][0].endswith(u))
                    order = [first, *(u for u in uuids if u != first)]
                    proc, _ = start_cuda(container, "--mib", "8", gpus=gpu_map(order))
                    world.processes.append(proc)
                    started = True
                attached = time.monotonic()
                ok = status(container).startswith("running") and "pattern=ok" in status(container)
                time.sleep(run)
                api.post(f"{path}/release", json={}).raise_for_status()
                ended = time.monotonic()
            except Exception as exc:  # counted, never raised: the bench goes on
                with results.lock:
                    results.failed.append(f"{namespace}/{name}: {exc}")
                continue
            with results.lock:
                results.cells.append(Cell(namespace, wait, bool(answer["resumed"]), ok, asked,
                                          attached, ended))  # fmt: skip
            think = min(max(rng.expovariate(1 / args.think), 2.0), 4 * args.think)
            time.sleep(think)


def mark_contended(cells: list[Cell], gpus: int) -> None:
    """A cell is contended when, at some moment of its wait, `gpus` other cells ran: no
    GPU could be its then, on demand or not. The rest is what on demand added."""
    for cell in cells:
        others = [c for c in cells if c is not cell]
        moments = [cell.asked, *(c.attached for c in others if cell.asked <= c.attached
                                  < cell.attached)]  # fmt: skip
        cell.contended = any(
            sum(1 for c in others if c.attached <= t < c.ended) >= gpus for t in moments
        )


def scrape(world: World, name: str) -> float:
    with world.agent.client(METRICS) as api:
        text = api.get("/metrics").text
    return sum(float(line.split()[-1]) for line in text.splitlines()
               if line.startswith(name + " ") or line.startswith(name + "{"))  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--notebooks", type=int, default=16)
    parser.add_argument("--gpus", type=int, default=4, choices=range(1, len(MORE_NODES) + 3))
    parser.add_argument("--namespaces", type=int, default=4)
    parser.add_argument("--minutes", type=float, default=4.0)
    parser.add_argument("--think", type=float, default=30.0, help="mean think time, seconds")
    parser.add_argument("--long-share", type=float, default=0.1)
    parser.add_argument("--idle", default="5s", help="the pods' hotmount.io/gpu-on-demand-idle")
    parser.add_argument("--min-hold", type=float, default=3.0)
    parser.add_argument("--gib", type=float, default=2.0, help="GPU memory per notebook")
    parser.add_argument("--cost-per-gib", type=float, default=0.25, help="seconds")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--work", type=Path, help="keep the agent's state and log here")
    args = parser.parse_args()
    step = args.gib * args.cost_per_gib
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as scratch:
        base = args.work or Path(scratch)
        standin = build_standin(base / "standin", gpus=args.gpus)
        (base / "world").mkdir()
        world = World(
            base / "world", standin,
            args=("--on-demand-min-hold", str(args.min_hold)),
            env_more={"FAKE_CUDA_STEP_MS": str(round(step * 1000))},
        )  # fmt: skip
        try:
            gpus = [nvml.FakeGpu(u, f"0000:{0x3b + i:02x}:00.0", i)
                    for i, u in enumerate(standin_uuids(args.gpus))]  # fmt: skip
            nvml.write_config(world.nvml_config, gpus)
            annotations = {ANNOTATION: "1", IDLE: args.idle}
            pods = []
            for i in range(args.notebooks):
                namespace = f"team-{i % args.namespaces}"
                name = f"nb-{i}"
                container = world.cluster.pod(
                    name, namespace=namespace, annotations=annotations, private_tmp=True
                )
                token = f"{name}-token"  # each notebook a caller of its own, as its pod is
                world.cluster.kube.add_token(token, f"system:serviceaccount:{namespace}:{name}",
                                             ["ops"])  # fmt: skip
                pods.append((name, namespace, container, token))
            results = Results()
            began = time.monotonic()
            until = began + args.minutes * 60
            threads = [
                threading.Thread(target=notebook, args=(world, name, ns, c, args, results, until,
                                                        random.Random(args.seed + i), token))
                for i, (name, ns, c, token) in enumerate(pods)
            ]  # fmt: skip
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            wall = time.monotonic() - began
            used = scrape(world, "hotmount_ondemand_gpu_seconds_total")
            dedicated = scrape(world, "hotmount_ondemand_dedicated_gpu_seconds_total")
            suspends = scrape(world, "hotmount_ondemand_suspends_total")
        finally:
            world.close()
    report(args, results, wall, used, dedicated, suspends, step, load_before)


def report(
    args: argparse.Namespace, results: Results, wall: float, used: float, dedicated: float,
    suspends: float, step: float, load_before: tuple[float, float, float],
) -> None:  # fmt: skip
    cells = results.cells
    mark_contended(cells, args.gpus)
    waits = [c.wait for c in cells]
    added = [max(0.0, c.wait - step) if c.resumed else c.wait for c in cells]
    wall_dedicated = args.notebooks * wall
    print(f"{args.notebooks} notebooks on {args.gpus} GPUs, {args.minutes:g} min of cells "
          f"({wall:.0f} s wall), think mean {args.think:g} s, long cells {args.long_share:.0%}, "
          f"idle {args.idle}, min hold {args.min_hold:g} s, restore {step:.2f} s "
          f"({args.gib:g} GiB x {args.cost_per_gib:g} s/GiB)")  # fmt: skip
    print(f"machine: {platform.node()}, {os.cpu_count()} CPUs, load "
          f"{load_before[0]:.1f} before, {os.getloadavg()[0]:.1f} after")  # fmt: skip
    print(f"GPU-seconds attached: {used:.0f} of {dedicated:.0f} the pods would hold dedicated "
          f"({1 - used / dedicated:.0%} fewer); against notebooks x wall ({wall_dedicated:.0f}): "
          f"{1 - used / wall_dedicated:.0%} fewer")  # fmt: skip
    lost = sum(1 for c in cells if not c.ok)
    resumed = sum(c.resumed for c in cells)
    print(f"cells: {len(cells)} ran, {len(results.failed)} failed, {lost} found their kernel's "
          f"pattern lost; {resumed} resumed; {suspends:.0f} suspends")  # fmt: skip
    if not cells:
        return
    free = [a for a, c in zip(added, cells, strict=True) if not c.contended]
    print(f"cells that found every GPU running another's cell while they waited: "
          f"{len(cells) - len(free)}; the others' added wait: p50 "
          f"{percentile(free, 50):.2f} s, p99 {percentile(free, 99):.2f} s, max {max(free):.2f} s"
          if free else "every cell found every GPU busy")  # fmt: skip
    print(f"wait per cell: p50 {percentile(waits, 50):.2f} s, p99 {percentile(waits, 99):.2f} s; "
          f"added on top of the restore: p50 {percentile(added, 50):.2f} s, "
          f"p99 {percentile(added, 99):.2f} s, mean {statistics.fmean(added):.2f} s")  # fmt: skip
    mean = statistics.fmean(waits)
    for namespace in sorted({c.namespace for c in cells}):
        mine = [c.wait for c in cells if c.namespace == namespace]
        ratio = statistics.fmean(mine) / mean if mean else 0.0
        print(f"  {namespace}: {len(mine)} cells, mean wait {statistics.fmean(mine):.2f} s "
              f"({ratio:.2f}x the mean), longest {max(mine):.2f} s")  # fmt: skip
    for line in results.failed[:5]:
        print(f"  failed: {line}")


if __name__ == "__main__":
    main()
