"""The agent's own work per unmanaged `nvcli mount --name POD --mount 0` and its unmount
through the aggregated API on the tier's real node, counted rather than timed, so that
the machine's load does not decide the figure:

- the API calls the agent makes, by verb and resource, from the kube-apiserver's audit
  log (Metadata level, every request; the node is started with it on);
- the CPU seconds of the agent pod (its cgroup's cpuacct, children included) and of the
  kube-apiserver process;
- the agent's own duration of each request (its JSON request log, durationMs).

An idle window of the same length first gives the background (reconcile passes,
heartbeats, the kubelet's probes); the per-mount figures are given raw and net of it.

    cd /work/wt-NAME && flock /work/k8s-tier.lock .venv/bin/python -m bench.mount_work
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from bench.pin_bench import GPUS, Plugin
from bench.stats import percentile
from tests.fakes import nvml as fake_nvml
from tests.k8s import flows
from tests.k8s.node import cluster
from tests.k8s.node.cluster import Node
from tests.support.image import build_agent_image

AGENT_USER_PREFIX = f"system:serviceaccount:{flows.NAMESPACE}:"
POLICY = """apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
- level: Metadata
"""


class AuditedNode(Node):
    """The tier's node, its kube-apiserver writing an audit log of every request."""

    def _spawn(self, name: str, command: Sequence[str], env=None) -> None:  # type: ignore[no-untyped-def]
        if name == "kube-apiserver":
            policy = self.workdir / "audit-policy.yaml"
            policy.write_text(POLICY)
            self.audit_log = self.workdir / "logs" / "audit.log"
            command = [
                *command,
                f"--audit-policy-file={policy}",
                f"--audit-log-path={self.audit_log}",
                "--audit-log-format=json",
                "--audit-log-maxsize=0",
            ]
        super()._spawn(name, command, env)


def audit_events(path: Path, start: int, end: int) -> list[dict]:
    with path.open("rb") as f:
        f.seek(start)
        data = f.read(end - start)
    events = []
    for line in data.decode(errors="replace").splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue
        # one event per request: a watch when it starts, the rest when they complete
        wanted = "ResponseStarted" if event.get("verb") == "watch" else "ResponseComplete"
        if event.get("stage") == wanted:
            events.append(event)
    return events


def kind(event: dict) -> str:
    ref = event.get("objectRef")
    if not ref:
        return f"{event['verb']} {event['requestURI'].split('?')[0]}"
    resource = ref.get("resource", "?")
    if ref.get("subresource"):
        resource += "/" + ref["subresource"]
    group = ref.get("apiGroup") or "core"
    scope = "named" if ref.get("name") else "collection"
    return f"{event['verb']} {resource}.{group} ({scope})"


def by_user(events: list[dict]) -> dict[str, Counter[str]]:
    found: dict[str, Counter[str]] = {}
    for event in events:
        user = event.get("user", {}).get("username", "?")
        found.setdefault(user, Counter())[kind(event)] += 1
    return found


def pod_cgroup_usage(uid: str) -> float:
    """CPU seconds of the pod's cgroup (cgroup v1 cpuacct or v2 cpu.stat)."""
    for root in (Path("/sys/fs/cgroup/cpu,cpuacct"), Path("/sys/fs/cgroup/cpuacct")):
        top = root / cluster.CGROUP_ROOT
        if top.is_dir():
            for found in top.rglob(f"pod{uid}"):
                if (found / "cpuacct.usage").exists():
                    return int((found / "cpuacct.usage").read_text()) / 1e9
    top = Path("/sys/fs/cgroup") / cluster.CGROUP_ROOT
    for found in top.rglob(f"pod{uid}"):
        if (found / "cpu.stat").exists():
            for line in (found / "cpu.stat").read_text().splitlines():
                if line.startswith("usage_usec "):
                    return int(line.split()[1]) / 1e6
    raise RuntimeError(f"no cpu cgroup for pod {uid}")


def agent_pid(uid: str) -> int:
    """The agent's Python process in the pod's cgroups (its pause process left out)."""
    for found in Path("/sys/fs/cgroup").rglob(f"pod{uid}"):
        for procs in found.rglob("cgroup.procs"):
            for pid in procs.read_text().split():
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
                if b"python" in cmdline or b"agent" in cmdline:
                    print("agent:", cmdline.replace(b"\0", b" ")[:120].decode())
                    return int(pid)
    raise RuntimeError(f"no agent process in pod {uid}'s cgroups")


def process_cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def syscalls(traced: Path, pairs: int) -> None:
    """Syscalls per pair by name; the event loop's wake-ups from other threads (asyncio's
    self-pipe: a one-byte send of NUL) counted on their own."""
    names: Counter[str] = Counter()
    wakeups = 0
    for line in traced.read_text(errors="replace").splitlines():
        call = line.split(" ", 1)[1] if " " in line else line
        if call.startswith("<... "):
            continue  # the end of a call counted at its start
        name = call.split("(", 1)[0]
        names[name] += 1
        if name == "sendto" and ', "\\0", 1,' in call:
            wakeups += 1
    print(f"\nstrace ({traced}): {sum(names.values()) / pairs:.1f} syscalls per pair; "
          f"event-loop wake-ups from threads {wakeups / pairs:.2f} per pair")  # fmt: skip
    for name, count in names.most_common(25):
        print(f"  {count / pairs:8.2f}/pair  {name}")


def utc_now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3]


class Window:
    def __init__(self, node: AuditedNode, agent_uid: str) -> None:
        self.node, self.uid = node, agent_uid
        self.apiserver = node.processes["kube-apiserver"].pid

    def __enter__(self) -> Window:
        self.offset = self.node.audit_log.stat().st_size
        self.cpu = pod_cgroup_usage(self.uid)
        self.api_cpu = process_cpu(self.apiserver)
        self.t0, self.utc0 = time.monotonic(), utc_now()
        return self

    def __exit__(self, *exc: object) -> None:
        time.sleep(0.5)  # the last calls' audit lines
        self.seconds = time.monotonic() - self.t0
        self.utc1 = utc_now()
        self.cpu = pod_cgroup_usage(self.uid) - self.cpu
        self.api_cpu = process_cpu(self.apiserver) - self.api_cpu
        self.events = audit_events(self.node.audit_log, self.offset,
                                   self.node.audit_log.stat().st_size)  # fmt: skip


def agent_requests(node: Node, pod: str, utc0: str, utc1: str) -> tuple[list[dict], list[str]]:
    """The request lines of the agent's log in the window, and every line's logger+message."""
    logs = node.kubectl("logs", "-n", flows.NAMESPACE, pod, "--tail=-1").stdout
    found, every = [], []
    for line in logs.splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if not utc0 <= entry.get("time", "")[:23] <= utc1:
            continue
        every.append(f"{entry.get('logger')}: {str(entry.get('msg'))[:60]}")
        if entry.get("msg") == "request":
            found.append(entry)
    return found, every


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pairs", type=int, default=20, help="mount+unmount pairs counted")
    parser.add_argument("--idle", type=float, default=0, help="idle window (s); 0: as the loop")
    parser.add_argument("--py-spy", help="then profile more pairs with this py-spy: raw stacks")
    parser.add_argument("--strace", action="store_true", help="then count syscalls of more pairs")
    args = parser.parse_args()
    why_not = cluster.missing_requirements()
    if why_not:
        sys.exit(f"mount_work: {why_not}")
    tree = os.popen("git rev-parse --short HEAD").read().strip()
    print(f"tree {tree}; load {os.getloadavg()}", flush=True)
    work = Path(tempfile.mkdtemp(prefix="mount-work-"))
    stack = cluster.build_stack()
    (work / "image").mkdir()
    image = build_agent_image(work / "image")
    node = AuditedNode(work / "node", stack, users=flows.PEOPLE).start()
    plugin = Plugin(node)
    release: flows.Release | None = None
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
        plugin.advertise(0)  # unmanaged: no allocatable GPU, no pin
        agent = release.agent_pod()
        assert agent is not None
        uid = json.loads(
            node.kubectl("get", "pod", agent, "-n", flows.NAMESPACE, "-o", "json").stdout
        )["metadata"]["uid"]
        pod = flows.new_name("work")
        with flows.running_pod(node, flows.pod_manifest(pod)):

            def pair() -> tuple[float, float]:
                t = time.perf_counter()
                done = flows.nvcli(node, "alice", "mount", "--name", pod, "--mount", "0",
                                   "-o", "json")  # fmt: skip
                mounted = time.perf_counter() - t
                if done.returncode != 0 or json.loads(done.stdout)["mounted"][0].get("pin"):
                    raise RuntimeError(f"mount: rc={done.returncode} {done.stdout}{done.stderr}")
                t = time.perf_counter()
                flows.nvcli_ok(node, "alice", "unmount", "--name", pod, "--unmount", "0")
                return mounted, time.perf_counter() - t

            for _ in range(2):  # caches: the agent's and nvcli's
                pair()
            walls: list[tuple[float, float]] = []
            load0 = os.getloadavg()
            with Window(node, uid) as loop:
                for _ in range(args.pairs):
                    walls.append(pair())
            load1 = os.getloadavg()
            with Window(node, uid) as idle:
                time.sleep(args.idle or loop.seconds)
            stamp = int(time.time())
            if args.py_spy:
                out = Path(tempfile.gettempdir()) / f"mount-work-{tree}-{stamp}.txt"
                spy = subprocess.Popen([args.py_spy, "record", "--pid", str(agent_pid(uid)),
                                        "--rate", "250", "--format", "raw", "--nonblocking",
                                        "--output", str(out)])  # fmt: skip
                time.sleep(2)
                for _ in range(args.pairs):
                    pair()
                spy.send_signal(signal.SIGINT)
                spy.wait(60)
                print(f"py-spy stacks: {out}")
            if args.strace:
                traced = Path(tempfile.gettempdir()) / f"mount-work-{tree}-{stamp}.strace"
                tracer = subprocess.Popen(["strace", "-f", "-qq", "-p", str(agent_pid(uid)),
                                           "-o", str(traced)])  # fmt: skip
                time.sleep(3)
                for _ in range(args.pairs):
                    pair()
                time.sleep(1)
                tracer.send_signal(signal.SIGINT)
                tracer.wait(60)
                syscalls(traced, args.pairs)
        requests, logged = agent_requests(node, agent, loop.utc0, loop.utc1)
    finally:
        if release is not None:
            release.uninstall()
        if plugin.running is not None:
            plugin.running.stop()
        node.stop()

    n = args.pairs
    rate = loop.seconds / idle.seconds  # idle counts scaled to the loop's length
    print(f"\n== tree {tree}: {n} unmanaged mount+unmount pairs, loop {loop.seconds:.1f} s, "
          f"idle window {idle.seconds:.1f} s; load {load0} -> {load1}")  # fmt: skip
    print(f"wall p50 mount {percentile([w[0] for w in walls], 50) * 1000:.0f} ms, "
          f"unmount {percentile([w[1] for w in walls], 50) * 1000:.0f} ms")  # fmt: skip
    net_cpu = (loop.cpu - idle.cpu * rate) / n
    print(f"agent pod CPU per pair: {loop.cpu / n:.4f} s raw, {net_cpu:.4f} s net of idle "
          f"({idle.cpu / idle.seconds:.4f} s/s idle)")  # fmt: skip
    print(f"kube-apiserver CPU per pair: {loop.api_cpu / n:.4f} s raw, "
          f"{(loop.api_cpu - idle.api_cpu * rate) / n:.4f} s net of idle")  # fmt: skip
    busy, quiet = by_user(loop.events), by_user(idle.events)
    for user in sorted(busy):
        if not (user.startswith(AGENT_USER_PREFIX) or user in ("alice",)):
            continue
        total = sum(busy[user].values())
        idle_total = sum(quiet.get(user, Counter()).values())
        print(f"\nAPI calls by {user}: {total / n:.2f} per pair raw, "
              f"{(total - idle_total * rate) / n:.2f} net of idle")  # fmt: skip
        for what, count in sorted(busy[user].items(), key=lambda kv: -kv[1]):
            bg = quiet.get(user, Counter())[what] * rate
            print(f"  {count / n:7.2f}/pair  (idle-scaled {bg / n:5.2f})  {what}")
    others = {u: sum(c.values()) for u, c in busy.items()
              if not (u.startswith(AGENT_USER_PREFIX) or u == "alice")}  # fmt: skip
    print(f"\nother users' calls in the loop: {others}")
    # alice's aggregated calls as the API server saw them (received -> complete)
    for what in sorted({kind(e) for e in loop.events if e["user"]["username"] == "alice"}):
        took = [
            (datetime.datetime.fromisoformat(e["stageTimestamp"].replace("Z", "+00:00"))
             - datetime.datetime.fromisoformat(e["requestReceivedTimestamp"].replace("Z", "+00:00"))
             ).total_seconds() * 1000
            for e in loop.events if e["user"]["username"] == "alice" and kind(e) == what
        ]  # fmt: skip
        print(f"apiserver-side alice {what}: n={len(took)} p50 {statistics.median(took):.1f} ms")
    print(f"\nagent log lines in the loop per pair: {len(logged) / n:.2f}")
    for what, count in Counter(logged).most_common(12):
        print(f"  {count / n:6.2f}/pair  {what}")
    groups: dict[str, list[float]] = {}
    for entry in requests:
        key = f"{entry.get('method')} {entry.get('path')} {entry.get('status')}"
        groups.setdefault(key, []).append(float(entry.get("durationMs", 0)))
    print("\nagent request log in the loop (durationMs):")
    for key, values in sorted(groups.items(), key=lambda kv: -len(kv[1])):
        print(f"  n={len(values):3d} p50 {statistics.median(values):8.1f} ms  "
              f"max {max(values):8.1f} ms  {key}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
