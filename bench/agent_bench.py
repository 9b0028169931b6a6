"""The agent over HTTP: overhead against the engine alone, and concurrent load.

    sudo .venv/bin/python -m bench.agent_bench [--iterations 300] [--clients 50] [--seconds 30]

Prints, in one run, on real runc containers (cgroup v1) with stand-in devices:
- mount+unmount round trip through uvicorn on loopback (a standalone agent process,
  static-token auth), p50/p99, against the same pair through the engine in-process,
  and the difference (the HTTP overhead);
- N clients, each mounting and unmounting its own device on its own container for
  S seconds: operations, errors, and afterwards every grant, node and record checked
  for leaks.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import httpx

from bench.stats import percentile, summary, timed
from hotmount.engine import Engine, EngineConfig
from tests.support.agent import free_port
from tests.support.runc import RuncContainer, make_rootfs, missing_requirements

TOKEN = "bench-token"


def cdi_spec(count: int) -> str:
    lines = ["cdiVersion: 0.6.0", "kind: bench.example/gpu", "devices:"]
    for n in range(count):
        lines += [
            f'  - name: "{n}"',
            "    containerEdits:",
            "      deviceNodes:",
            f"        - {{path: /dev/nvidia{n}, type: c, major: 195, minor: {n}}}",
        ]
    return "\n".join(lines) + "\n"


def start_agent(work: Path, cdi: Path, state: Path, port: int) -> subprocess.Popen[bytes]:
    (work / "token").write_text(TOKEN)
    log = (work / "agent.log").open("w")
    agent = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "agent.main",
            "--no-kubernetes",
            "--listen",
            f"127.0.0.1:{port}",
            "--token-file",
            str(work / "token"),
            "--cdi-dir",
            str(cdi),
            "--state-dir",
            str(state),
            "--no-use-nvml",
            "--log-level",
            "WARNING",
            "--reconcile-interval",
            "3600",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    log.close()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz").status_code == 200:
                return agent
        except httpx.HTTPError:
            time.sleep(0.1)
    agent.kill()
    raise RuntimeError((work / "agent.log").read_text())


def round_trips(api: httpx.Client, container: RuncContainer, device: str, n: int) -> list[float]:
    path = f"/v1/containers/{container.id}/devices"

    def pair() -> None:
        assert api.post(path, json={"devices": [device]}).status_code == 200
        assert api.delete(f"{path}/{device}").status_code == 200

    pair()
    return [timed(pair) for _ in range(n)]


def engine_pairs(engine: Engine, container: RuncContainer, device: str, n: int) -> list[float]:
    def pair() -> None:
        engine.mount(container.id, [device])
        engine.unmount(container.id, [device])

    pair()
    return [timed(pair) for _ in range(n)]


def load(
    url: str, containers: list[RuncContainer], seconds: float
) -> tuple[Counter[str], list[float]]:
    outcomes: Counter[str] = Counter()
    latencies: list[float] = []
    lock = threading.Lock()
    stop_at = time.monotonic() + seconds

    def client(index: int, container: RuncContainer) -> None:
        device = f"bench.example/gpu={index}"
        path = f"/v1/containers/{container.id}/devices"
        with httpx.Client(
            base_url=url, headers={"authorization": f"Bearer {TOKEN}"}, timeout=60
        ) as api:
            while time.monotonic() < stop_at:
                started = time.perf_counter()
                try:
                    codes = (
                        api.post(path, json={"devices": [device]}).status_code,
                        api.delete(f"{path}/{device}").status_code,
                    )
                    result = "ok" if codes == (200, 200) else f"http {codes}"
                except httpx.HTTPError as exc:
                    result = type(exc).__name__
                with lock:
                    outcomes[result] += 1
                    latencies.append(time.perf_counter() - started)

    threads = [threading.Thread(target=client, args=(i, c)) for i, c in enumerate(containers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return outcomes, latencies


def leaks(containers: list[RuncContainer], state: Path) -> list[str]:
    found = []
    for index, container in enumerate(containers):
        if "c 195:" in (container.v1_devices_dir / "devices.list").read_text():
            found.append(f"{container.id[:12]}: a 195:* grant is left")
        if f"nvidia{index}" in container.ls_dev():
            found.append(f"{container.id[:12]}: /dev/nvidia{index} is left")
    found += [f"ledger record {p.name}" for p in (state / "containers").glob("*.json")]
    found += [f"claim {p.name}" for p in (state / "claims").iterdir()]
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--iterations", type=int, default=300)
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--seconds", type=float, default=30)
    args = parser.parse_args()
    if why := missing_requirements():
        print(f"agent_bench: {why}", file=sys.stderr)
        return 1
    work = Path(tempfile.mkdtemp(prefix="hotmount-agent-bench-"))
    cdi = work / "cdi"
    cdi.mkdir()
    (cdi / "bench.yaml").write_text(cdi_spec(args.clients))
    for name in ("state-agent", "state-engine"):
        (work / name).mkdir()
        subprocess.run(["mount", "-t", "tmpfs", name, str(work / name)], check=True)
    rootfs = make_rootfs(work)
    port = free_port()
    agent = start_agent(work, cdi, work / "state-agent", port)
    containers: list[RuncContainer] = []
    try:
        containers.append(RuncContainer(work, rootfs, "v1"))
        engine = Engine(
            EngineConfig(cdi_dirs=(str(cdi),), state_dir=work / "state-engine", use_nvml=False)
        )
        with httpx.Client(
            base_url=f"http://127.0.0.1:{port}",
            timeout=60,
            headers={"authorization": f"Bearer {TOKEN}"},
        ) as api:
            http = round_trips(api, containers[0], "bench.example/gpu=0", args.iterations)
        direct = engine_pairs(engine, containers[0], "bench.example/gpu=0", args.iterations)
        print(
            f"{args.iterations} mount+unmount pairs on one container (cgroup v1, ledger on tmpfs)"
        )
        print(summary("engine in-process: mount+unmount", direct))
        print(summary("HTTP through uvicorn: mount+unmount", http))
        overhead = percentile(http, 50) - percentile(direct, 50)
        print(f"{'HTTP overhead, p50 difference (two requests)':<44} {overhead * 1000:8.3f} ms")
        print(f"{'... per request':<44} {overhead * 500:8.3f} ms\n")

        containers += [RuncContainer(work, rootfs, "v1") for _ in range(args.clients - 1)]
        outcomes, latencies = load(f"http://127.0.0.1:{port}", containers, args.seconds)
        total = sum(outcomes.values())
        print(f"{args.clients} clients x {args.seconds:g} s, each on its own container and device")
        print(f"{'pairs done':<44} {total:8d}  ({total / args.seconds:.1f} pairs/s)")
        print(f"{'errors':<44} {total - outcomes['ok']:8d}  {dict(outcomes)}")
        print(summary("mount+unmount under load", latencies))
        leaked = leaks(containers, work / "state-agent")
        print(f"{'leaked grants, nodes, records, claims':<44} {len(leaked):8d}  {leaked[:5]}")
    finally:
        agent.terminate()
        agent.wait()
        for container in containers:
            container.stop()
        for name in ("state-agent", "state-engine"):
            subprocess.run(["umount", str(work / name)], check=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
