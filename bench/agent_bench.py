"""The agent over HTTP: overhead against the engine alone, and concurrent load.

    sudo .venv/bin/python -m bench.agent_bench [--iterations 300] [--clients 50] [--seconds 30]

Prints, in one run, on real runc containers (cgroup v1) with stand-in devices:
- mount+unmount round trip through uvicorn on loopback (a standalone agent process,
  static-token auth), p50/p99, against the same pair through the engine in-process,
  and the difference (the HTTP overhead);
- N clients, each mounting and unmounting its own device on its own container for
  S seconds: pairs per second, p50/p99 per pair and per request, errors, and afterwards
  every grant, node and record checked for leaks. A client answered 429 waits the
  Retry-After and asks again, as a well-behaved client does (counted, not an error);
- the same N clients as threads calling the engine in-process for S seconds, so the
  HTTP share of the load figures is visible.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import httpx

from bench.stats import percentile, summary, timed
from hotmount.engine.core import Engine, EngineConfig
from hotmount.errors import HotmountError
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


class Load:
    """What N clients saw: outcomes per pair, latency per pair and per request."""

    def __init__(self) -> None:
        self.outcomes: Counter[str] = Counter()
        self.pairs: list[float] = []
        self.requests: list[float] = []
        self.retried = 0
        self.lock = threading.Lock()

    def record(self, result: str, started: float) -> None:
        """One mount+unmount pair ended with `result`, begun at `started` (perf_counter)."""
        with self.lock:
            self.outcomes[result] += 1
            self.pairs.append(time.perf_counter() - started)

    def run(self, clients: list[threading.Thread]) -> None:
        for thread in clients:
            thread.start()
        for thread in clients:
            thread.join()


def load(url: str, containers: list[RuncContainer], seconds: float) -> Load:
    seen = Load()
    stop_at = time.monotonic() + seconds

    def request(api: httpx.Client, method: str, path: str, **kwargs: object) -> int:
        """One call, asked again after Retry-After while the agent answers 429."""
        while True:
            started = time.perf_counter()
            answer = api.request(method, path, **kwargs)  # type: ignore[arg-type]
            took = time.perf_counter() - started
            with seen.lock:
                seen.requests.append(took)
                seen.retried += answer.status_code == 429
            if answer.status_code != 429:
                return answer.status_code
            time.sleep(float(answer.headers.get("retry-after", "1")))

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
                        request(api, "POST", path, json={"devices": [device]}),
                        request(api, "DELETE", f"{path}/{device}"),
                    )
                    result = "ok" if codes == (200, 200) else f"http {codes}"
                except httpx.HTTPError as exc:
                    result = type(exc).__name__
                seen.record(result, started)

    seen.run([threading.Thread(target=client, args=(i, c)) for i, c in enumerate(containers)])
    return seen


def load_in_process(engine: Engine, containers: list[RuncContainer], seconds: float) -> Load:
    """The same clients as threads calling the engine: no HTTP, no guard, no service."""
    seen = Load()
    stop_at = time.monotonic() + seconds

    def timed_call(fn: Callable[[], object]) -> None:
        took = timed(fn)
        with seen.lock:
            seen.requests.append(took)

    def client(index: int, container: RuncContainer) -> None:
        device = f"bench.example/gpu={index}"
        while time.monotonic() < stop_at:
            started = time.perf_counter()
            try:
                timed_call(lambda: engine.mount(container.id, [device]))
                timed_call(lambda: engine.unmount(container.id, [device]))
                result = "ok"
            except HotmountError as exc:
                result = type(exc).__name__
            seen.record(result, started)

    seen.run([threading.Thread(target=client, args=(i, c)) for i, c in enumerate(containers)])
    return seen


def cpu_seconds(pid: int) -> float:
    """User + system CPU time a process has used (/proc/PID/stat fields 14 and 15)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def report(seen: Load, seconds: float, where: str) -> None:
    total = sum(seen.outcomes.values())
    done = seen.outcomes["ok"]
    print(f"{f'pairs done{where}':<44} {done:8d}  ({done / seconds:.1f} pairs/s)")
    print(f"{f'errors{where}':<44} {total - done:8d}  {dict(seen.outcomes)}")
    print(summary(f"mount+unmount under load{where}", seen.pairs))
    print(summary(f"one request under load{where}", seen.requests))


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
        agent_cpu, own_cpu = cpu_seconds(agent.pid), sum(os.times()[:2])
        seen = load(f"http://127.0.0.1:{port}", containers, args.seconds)
        agent_cpu, own_cpu = cpu_seconds(agent.pid) - agent_cpu, sum(os.times()[:2]) - own_cpu
        print(f"{args.clients} clients x {args.seconds:g} s, each on its own container and device")
        report(seen, args.seconds, "")
        print(f"{'429 answers waited out and asked again':<44} {seen.retried:8d}")
        # What limits throughput: the agent is one process (one GIL: about one core).
        print(
            f"{'CPU: agent, clients (cores busy)':<44} {agent_cpu / args.seconds:8.2f}  "
            f"{own_cpu / args.seconds:.2f}  (of {os.cpu_count()}; "
            f"agent {agent_cpu / max(1, seen.outcomes['ok']) * 1000:.2f} ms per pair)"
        )
        leaked = leaks(containers, work / "state-agent")
        print(f"{'leaked grants, nodes, records, claims':<44} {len(leaked):8d}  {leaked[:5]}")

        direct_load = load_in_process(engine, containers, args.seconds)
        print(f"\nthe same {args.clients} clients as threads, engine in-process")
        report(direct_load, args.seconds, " (in-process)")
        leaked = leaks(containers, work / "state-engine")
        print(f"{'leaked grants, nodes, records, claims':<44} {len(leaked):8d}  {leaked[:5]}")
        # From throughput, not latency: 50 threads in one process queue on its GIL, so
        # in-process latencies are mostly waiting and say nothing of a pair's own cost.
        http_rate = seen.outcomes["ok"] / args.seconds
        engine_rate = direct_load.outcomes["ok"] / args.seconds
        share = 1 - http_rate / engine_rate if engine_rate else float("nan")
        print(f"{'HTTP share of a pair under load (pairs/s)':<44} {share * 100:7.0f} %")
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
