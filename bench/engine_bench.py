"""Engine latency on real runc containers, against the shell pipeline earlier tools use.

    sudo .venv/bin/python -m bench.engine_bench [--iterations 300] [--idle-processes 5000]

Prints p50/p99 of:
- engine mount and unmount of one stand-in GPU (195:0, plus nvidiactl) on v1 and v2;
- on v1, the same mount (the same two nodes) done the way GPUMounter does it, in the
  same run: per node `sh -c "echo 'c M:N rw' > devices.allow"` then
  `nsenter --target PID --mount sh -c "mknod ... && chmod ..."`, and its unmount: per
  node `nsenter --target PID --mount rm PATH` then `sh -c "echo ... > devices.deny"`;
  the ratios against the engine's mount and unmount;
- on v2 there is no devices.allow to write (the grant is a BPF map update no shell
  tool of GPUMounter's kind makes), so its shell analogue is the nsenter half alone:
  `nsenter ... mknod && chmod` per node to mount, `nsenter ... rm` per node to unmount,
  a lower bound on any shell pipeline there. v2 ratios are printed against both that
  analogue and the v1 pipeline's figure from the same run, each named;
- resolution of a container ID to its PIDs and cgroups, with N extra idle processes
  on the host (cold: a fresh resolver walks the cgroup tree; warm: cached), against
  the /proc scan it avoids;
- in the same run, the engine as it was before issue 32: the unmount's open-file scan
  in a child forked per call (hotmount/tenantfs/forked.py) instead of a kept worker
  (hotmount/tenantfs/workers.py); a fork also slows the mount after it (copy-on-write faults);
- the mount under `--inject-driver=auto` (the agent's default) with no driver source,
  its CDI specs parsed once per text against parsed on every mount (as before).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.stats import percentile, summary, timed
from hotmount.driver import sources
from hotmount.engine.core import Engine, EngineConfig
from hotmount.host.containers import ContainerResolver
from hotmount.state.claims import Claim, Footprint
from hotmount.tenantfs import forked, workers
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


class ForkPerCall:
    """The pool's interface the way the engine worked before issue 32: a child forked
    for every call (forked.run), for a baseline in the same process."""

    def call(self, function, args, what, deadline=None):  # type: ignore[no-untyped-def]
        return forked.run(lambda: function(*args), what, deadline=deadline)

    def close(self) -> None:
        pass


def bench_before(
    engine: Engine, container: RuncContainer, iterations: int
) -> dict[str, list[float]]:
    """Mount and unmount with the scan forked per call (the engine before issue 32)."""
    kept = workers.POOL
    workers.POOL = ForkPerCall()  # type: ignore[assignment]
    try:
        samples = bench_engine(engine, container, iterations)
    finally:
        workers.POOL = kept
    for name in ("mount", "unmount"):
        print(summary(f"before: fork per scan, engine {name} ({container.mode})", samples[name]))
    return samples


def bench_auto(engine: Engine, container: RuncContainer, iterations: int) -> None:
    """`auto` with no driver source: every mount looks for one in the CDI specs."""
    samples: dict[str, list[float]] = {"parsed every mount (before)": [], "parsed once": []}
    engine.mount(container.id, [GPU])
    engine.unmount(container.id, [GPU])
    for _ in range(iterations):
        for name, values in samples.items():
            if name.startswith("parsed every"):
                sources._parsed.clear()
            values.append(timed(lambda: engine.mount(container.id, [GPU])))
            engine.unmount(container.id, [GPU])
    for name, values in samples.items():
        print(summary(f"auto, CDI specs {name} ({container.mode})", values))
    before, now = samples["parsed every mount (before)"], samples["parsed once"]
    print(ratio_line(f"ratio before p50 / now p50, auto mount ({container.mode})", before, now))


NODES = (("/dev/nvidia0", 195, 0), ("/dev/nvidiactl", 195, 255))  # what the engine mounts


def bench_shell(container: RuncContainer, iterations: int) -> tuple[list[float], list[float]]:
    """GPUMounter's way, for the same two nodes: a shell per devices.allow write, and
    nsenter into the mount namespace running mknod and chmod from the container's image;
    to unmount, nsenter rm, then a shell per devices.deny write. On v2 only the nsenter
    half (there is no devices file to write). Returns (mount, unmount) samples."""
    v1 = container.mode == "v1"
    enter = ["nsenter", "--target", str(container.pid), "--mount"]
    mounts, unmounts = [], []

    def cgroup_write(name: str, major: int, minor: int) -> None:
        if v1:
            target = container.v1_devices_dir / name
            subprocess.run(["sh", "-c", f"echo 'c {major}:{minor} rw' > {target}"], check=True)

    def mount() -> None:
        for path, major, minor in NODES:
            cgroup_write("devices.allow", major, minor)
            subprocess.run(
                [*enter, "sh", "-c", f"mknod {path} c {major} {minor} && chmod 666 {path}"],
                check=True,
            )

    def unmount() -> None:
        for path, major, minor in NODES:
            subprocess.run([*enter, "rm", path], check=True)
            cgroup_write("devices.deny", major, minor)

    for _ in range(iterations):
        mounts.append(timed(mount))
        unmounts.append(timed(unmount))
    return mounts, unmounts


def ratio_line(label: str, baseline: list[float], engine: list[float]) -> str:
    return f"{label:<44} {percentile(baseline, 50) / percentile(engine, 50):8.1f}x"


def bench_claims(engine: Engine, iterations: int) -> None:
    """What claims bookkeeping adds to one mount and unmount: check under the claims lock
    and write (mount), then release (unmount), with 0 and 50 other containers' claims on
    disk (on other GPUs: every claim file is read on every check, none collides)."""
    device = engine.inventory.resolve_all([GPU])[0]
    owner = "f" * 64
    others = [
        Claim(f"{n:064x}", f"bench/gpu={n}", f"{n:064x}", Footprint(frozenset({(195, 100 + n)})))
        for n in range(50)
    ]
    for count in (0, len(others)):
        engine.ledger.add_claims(others[:count])

        def cycle() -> None:
            engine._claim([device], owner, False, owner, None, None)
            engine.ledger.release(device.key, owner)

        cycle()
        samples = [timed(cycle) for _ in range(iterations)]
        print(summary(f"claims: check+write+release, {count} others", samples))
        for claim in others[:count]:
            engine.ledger.release(claim.device, claim.owner)


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


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout.strip()


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
    auto = Engine(
        EngineConfig(
            cdi_dirs=(str(work / "cdi"),),
            state_dir=work / "state",
            use_nvml=False,
            inject_driver="auto",
        )
    )
    print(f"cgroup layout: {engine.layout.mode}; ledger on tmpfs; {args.iterations} iterations")
    print(f"load: {uptime()}\n")
    shell_iterations = max(50, args.iterations // 3)
    v1_shell: tuple[list[float], list[float]] = ([], [])
    for mode in ("v1", "v2"):
        container = RuncContainer(work, rootfs, mode)
        try:
            before = bench_before(engine, container, args.iterations)
            samples = bench_engine(engine, container, args.iterations)
            for name, values in samples.items():
                print(summary(f"engine {name} ({mode})", values))
            for name in ("mount", "unmount"):
                label = f"ratio before p50 / now p50, {name} ({mode})"
                print(ratio_line(label, before[name], samples[name]))
            bench_auto(auto, container, args.iterations)
            mount, unmount = bench_shell(container, shell_iterations)
            if mode == "v1":
                v1_shell = (mount, unmount)
                print(summary("baseline: shell devices.allow + nsenter mknod", mount))
                print(summary("baseline: shell nsenter rm + devices.deny", unmount))
                for name in ("mount", "mount-resolved"):
                    label = f"ratio shell p50 / engine {name} p50 (v1)"
                    print(ratio_line(label, mount, samples[name]))
                for name in ("unmount", "unmount-resolved"):
                    label = f"ratio shell p50 / engine {name} p50 (v1)"
                    print(ratio_line(label, unmount, samples[name]))
                bench_claims(engine, args.iterations)
                bench_resolution(container, engine, args.idle_processes, 50)
            else:
                print(summary("baseline v2 analogue: nsenter mknod only", mount))
                print(summary("baseline v2 analogue: nsenter rm only", unmount))
                for name, base, v1_base in (
                    ("mount", mount, v1_shell[0]),
                    ("unmount", unmount, v1_shell[1]),
                ):
                    engine_p50 = samples[name]
                    analogue = f"ratio v2 analogue p50 / engine {name} p50 (v2)"
                    print(ratio_line(analogue, base, engine_p50))
                    print(
                        ratio_line(
                            f"ratio v1 shell p50 / engine {name} p50 (v2)", v1_base, engine_p50
                        )
                    )
            print()
        finally:
            container.stop()
    workers.POOL.close()
    subprocess.run(["umount", str(work / "state")], check=False)
    print(f"load: {uptime()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
