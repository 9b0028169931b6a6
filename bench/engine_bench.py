"""Engine latency on real runc containers, against the shell pipeline earlier tools use.

    sudo .venv/bin/python -m bench.engine_bench [--iterations 300] [--idle-processes 5000]

Prints p50/p99 of:
- engine mount and unmount of one stand-in GPU (195:0, plus nvidiactl) on v1 and v2;
- on v1, the same mount (the same two nodes) done the way GPUMounter does it, in the
  same run: per node `sh -c "echo 'c M:N rw' > devices.allow"` then
  `nsenter --target PID --mount sh -c "mknod ... && chmod ..."`, and the ratios;
- resolution of a container ID to its PIDs and cgroups, with N extra idle processes
  on the host (cold: a fresh resolver walks the cgroup tree; warm: cached), against
  the /proc scan it avoids.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.stats import percentile, summary, timed
from hotmount.containers import ContainerResolver
from hotmount.engine import Engine, EngineConfig
from tests.support.fixtures import STAND_IN_SPEC
from tests.support.runc import RuncContainer, make_rootfs, missing_requirements

GPU = "nvidia.com/gpu=0"


def bench_engine(
    engine: Engine, container: RuncContainer, iterations: int
) -> dict[str, list[float]]:
    """Mount and unmount from the container ID (resolution included, as the agent does)
    and into an already resolved container (what the shell pipeline is given: PID, path)."""
    engine.mount(container.id, [GPU])  # the first v2 mount wraps the program once
    engine.unmount(container.id, [GPU])
    resolved = engine.resolve(container.id)
    samples: dict[str, list[float]] = {
        "mount": [],
        "unmount": [],
        "mount-resolved": [],
        "unmount-resolved": [],
    }
    for _ in range(iterations):
        samples["mount"].append(timed(lambda: engine.mount(container.id, [GPU])))
        samples["unmount"].append(timed(lambda: engine.unmount(container.id, [GPU])))
        samples["mount-resolved"].append(timed(lambda: engine.mount(resolved, [GPU])))
        samples["unmount-resolved"].append(timed(lambda: engine.unmount(resolved, [GPU])))
    assert container.open_result("/dev/nvidia0") == "ENOENT"
    return samples


NODES = (("/dev/nvidia0", 195, 0), ("/dev/nvidiactl", 195, 255))  # what the engine mounts


def bench_shell(container: RuncContainer, iterations: int) -> list[float]:
    """GPUMounter's way, for the same two nodes: a shell per devices.allow write, and
    nsenter into the mount namespace running mknod and chmod from the container's image."""
    allow = container.v1_devices_dir / "devices.allow"
    deny = container.v1_devices_dir / "devices.deny"
    enter = ["nsenter", "--target", str(container.pid), "--mount"]
    samples = []
    for _ in range(iterations):

        def pipeline() -> None:
            for path, major, minor in NODES:
                subprocess.run(["sh", "-c", f"echo 'c {major}:{minor} rw' > {allow}"], check=True)
                subprocess.run(
                    [*enter, "sh", "-c", f"mknod {path} c {major} {minor} && chmod 666 {path}"],
                    check=True,
                )

        samples.append(timed(pipeline))
        for path, major, minor in NODES:
            subprocess.run([*enter, "rm", path], check=True)
            deny.write_text(f"c {major}:{minor} rw")
    return samples


def bench_resolution(container: RuncContainer, engine: Engine, extra: int, iterations: int) -> None:
    idle = [subprocess.Popen(["sleep", "600"]) for _ in range(extra)]
    try:
        cold = [
            timed(lambda: ContainerResolver(engine.host, engine.layout).resolve(container.id))
            for _ in range(iterations)
        ]
        resolver = ContainerResolver(engine.host, engine.layout)
        warm = [timed(lambda: resolver.resolve(container.id)) for _ in range(iterations)]
        scan = [
            timed(lambda: resolver._scan_proc(container.id))
            for _ in range(max(5, iterations // 10))
        ]
        print(summary(f"resolve by ID, {extra} idle processes, cold", cold))
        print(summary(f"resolve by ID, {extra} idle processes, warm", warm))
        print(summary(f"baseline: /proc scan of {extra}+ processes", scan))
        print(
            f"{'ratio /proc scan p50 / cold resolve p50':<44} "
            f"{percentile(scan, 50) / percentile(cold, 50):8.1f}x"
        )
    finally:
        for process in idle:
            process.kill()
        for process in idle:
            process.wait()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--iterations", type=int, default=300)
    parser.add_argument("--idle-processes", type=int, default=5000)
    args = parser.parse_args()
    if why := missing_requirements():
        print(f"engine_bench: {why}", file=sys.stderr)
        return 1
    work = Path(tempfile.mkdtemp(prefix="hotmount-bench-"))
    (work / "cdi").mkdir()
    (work / "cdi" / "stand-in.yaml").write_text(STAND_IN_SPEC)
    rootfs = make_rootfs(work)
    # Production keeps the ledger on tmpfs (/run/gpu-hotmount): so does the benchmark.
    (work / "state").mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "hotmount-bench", str(work / "state")], check=True)
    engine = Engine(
        EngineConfig(cdi_dirs=(str(work / "cdi"),), state_dir=work / "state", use_nvml=False)
    )
    print(f"cgroup layout: {engine.layout.mode}; ledger on tmpfs; {args.iterations} iterations\n")
    for mode in ("v1", "v2"):
        container = RuncContainer(work, rootfs, mode)
        try:
            samples = bench_engine(engine, container, args.iterations)
            for name, values in samples.items():
                print(summary(f"engine {name} ({mode})", values))
            if mode == "v1":
                shell = bench_shell(container, max(50, args.iterations // 3))
                print(summary("baseline: shell devices.allow + nsenter mknod", shell))
                for name in ("mount", "mount-resolved"):
                    ratio = percentile(shell, 50) / percentile(samples[name], 50)
                    print(f"{f'ratio shell p50 / engine {name} p50 (v1)':<44} {ratio:8.1f}x")
                bench_resolution(container, engine, args.idle_processes, 50)
            print()
        finally:
            container.stop()
    subprocess.run(["umount", str(work / "state")], check=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
