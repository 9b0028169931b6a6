"""The engine's mount, this tree against another (a git worktree of an earlier commit), in
blocks that alternate between the two, so a change of the machine's load falls on both:

    git worktree add /work/wt-before REV
    sudo .venv/bin/python -m bench.engine_ab --before /work/wt-before [--blocks 30 --block 25]

Each tree runs in its own process (`--serve`: the engine on a tmpfs ledger, one runc
container per cgroup mode, the stand-in GPU of bench/engine_bench.py) and is asked for
blocks of mount and unmount cycles over a pipe; the order of the two flips every block.
Prints the mount's p50/p99 per tree and mode, and the ratio of this tree's p50 to the
other's. engine_bench's ratio to the shell moves by a quarter from run to run on a busy
2-core machine (its baseline forks); this comparison of the engine alone does not.
Trees whose modules had other names (hotmount.engine before issue 41) are served too.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.stats import percentile

MODES = ("v1", "v2")
GPU = "nvidia.com/gpu=0"


def serve() -> None:
    """One tree's engine, driven over stdin: `run MODE K` answers K mounts' seconds."""
    try:
        from hotmount.engine.core import Engine, EngineConfig
    except ImportError:  # the layout before issue 41
        from hotmount.engine import Engine, EngineConfig  # type: ignore[attr-defined,no-redef]
    from tests.support.fixtures import STAND_IN_SPEC
    from tests.support.runc import RuncContainer, make_rootfs

    work = Path(tempfile.mkdtemp(prefix="hotmount-ab-"))
    (work / "cdi").mkdir()
    (work / "cdi" / "stand-in.yaml").write_text(STAND_IN_SPEC)
    rootfs = make_rootfs(work)
    (work / "state").mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "hotmount-ab", str(work / "state")], check=True)
    containers: dict[str, Any] = {}
    try:
        engine = Engine(
            EngineConfig(cdi_dirs=(str(work / "cdi"),), state_dir=work / "state", use_nvml=False)
        )
        for mode in MODES:
            containers[mode] = RuncContainer(work, rootfs, mode)
            engine.mount(containers[mode].id, [GPU])  # the first v2 mount wraps the program
            engine.unmount(containers[mode].id, [GPU])
        print("ready", flush=True)
        for line in sys.stdin:
            words = line.split()
            if words[0] != "run":
                break
            container, seconds = containers[words[1]], []
            for _ in range(int(words[2])):
                started = time.perf_counter()
                engine.mount(container.id, [GPU])
                seconds.append(time.perf_counter() - started)
                engine.unmount(container.id, [GPU])
            print(json.dumps(seconds), flush=True)
    finally:
        for container in containers.values():
            container.stop()
        subprocess.run(["umount", str(work / "state")], check=False)


def start(tree: Path) -> subprocess.Popen[str]:
    server = subprocess.Popen(
        [sys.executable, __file__, "--serve"],  # this file, the tree's own modules
        cwd=tree,
        env={**os.environ, "PYTHONPATH": str(tree)},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert server.stdout is not None
    if server.stdout.readline().strip() != "ready":
        raise SystemExit(f"engine_ab: the engine of {tree} did not start")
    return server


def ask(server: subprocess.Popen[str], mode: str, count: int) -> list[float]:
    assert server.stdin is not None and server.stdout is not None
    server.stdin.write(f"run {mode} {count}\n")
    server.stdin.flush()
    return list(json.loads(server.stdout.readline()))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--before", type=Path, help="the other tree (a git worktree)")
    parser.add_argument("--blocks", type=int, default=30)
    parser.add_argument("--block", type=int, default=25, help="mounts per block")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve()
        return 0
    if args.before is None:
        parser.error("--before DIR is required")
    trees = {"before": args.before.resolve(), "now": Path(__file__).resolve().parents[1]}
    servers = {name: start(tree) for name, tree in trees.items()}
    samples: dict[tuple[str, str], list[float]] = {(n, m): [] for n in trees for m in MODES}
    print(f"load at the start: {Path('/proc/loadavg').read_text().strip()}")
    try:
        for block in range(args.blocks):
            for mode in MODES:
                order = list(trees) if block % 2 == 0 else list(reversed(trees))
                for name in order:
                    samples[(name, mode)] += ask(servers[name], mode, args.block)
    finally:
        for server in servers.values():
            assert server.stdin is not None
            server.stdin.write("stop\n")
            server.stdin.flush()
            server.wait()
    for mode in MODES:
        before, now = samples[("before", mode)], samples[("now", mode)]
        b50, n50 = percentile(before, 50) * 1e3, percentile(now, 50) * 1e3
        print(
            f"engine mount ({mode}), n={len(now)} each: before p50 {b50:.3f} ms p99 "
            f"{percentile(before, 99) * 1e3:.3f} ms | now p50 {n50:.3f} ms p99 "
            f"{percentile(now, 99) * 1e3:.3f} ms | now/before p50 {n50 / b50:.3f}x"
        )
    print(f"load at the end: {Path('/proc/loadavg').read_text().strip()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
