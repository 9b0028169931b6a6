"""nvcli's wall time, which is mostly interpreter start and imports, against Python's own
start and against kubectl on the same API server path.

    sudo .venv/bin/python -m bench.cli_bench [--iterations 30] [--before REV]
    sudo flock /work/k8s-tier.lock .venv/bin/python -m bench.cli_bench --kubectl  # optional
    bash scripts/build-cli.sh && sudo .venv/bin/python -m bench.cli_bench \
        --pyz dist/nvcli.pyz --wheel dist/gpu_hotmount-0.1.0-py3-none-any.whl

Starts, on this machine, a real `hotmount-agent` process for a runc pod `nb` behind the
fake API server's front proxy (tests/agent/conftest.py's Cluster), mounts one stand-in
GPU into it, then times each command as a new process, N times, and prints p50/p99:

- `python -c pass` (the floor: the same interpreter, the same venv);
- `nvcli --help`, `nvcli version`;
- `nvcli status --name nb --agent URL` (straight to the agent);
- `nvcli status --name nb` through the API server (the aggregated path, a kubeconfig);
- `kubectl get --raw` of that same aggregated path, with the same kubeconfig;

then the ratios of each to `python -c pass`, and of nvcli's aggregated status to
kubectl's (`--pyz`: the one-file nvcli's `version`, `--help` and `status` against nvcli
installed from the same wheel in a venv, both on /usr/bin/python3, and their ratios);
CPU time (user + system) too, which a loaded machine disturbs less. Commands
run round-robin, so load changes fall on all alike. `--before REV` times the same
commands from the `cli/`, `agent/` and `hotmount/` of git revision REV (extracted with
`git archive`; this venv's packages) as "before" figures. `--kubectl` times the real
single-node Kubernetes tier instead (a node of its own from bench/tier_node.py, or the
one whose kubeconfig is in $HOTMOUNT_K8S_KUBECONFIG, with a pod it runs with a
gpumount): `nvcli status` against `kubectl get --raw` of the same gpumount, through the
real aggregated API.

Notes (2 cores shared with other work; indicative only, with `uptime` load):
before this work (ee6062f, typer 0.29), load 0.2-0.8, one run each of 3-5:
`python -c pass` 40-50 ms, `nvcli --help` 560-810 ms, `nvcli version` 710-790 ms;
`import cli.main` alone ~0.40 s: httpx with its own command line (click, rich,
pygments), pydantic and every agent model, importlib.metadata; the kubernetes package
(~0.2 s more) on every kubeconfig call; typer 0.26+ building a pydantic TypeAdapter
per flag (~30 per call) on top. One run of this script, 15 rounds, load 4.4 falling to
1.7, p50 wall before (ee6062f's cli/ with typer 0.25) / after: `--help` 825 / 210 ms,
`version` 720 / 210 ms, status direct 1014 / 824 ms, status aggregated 1398 / 841 ms,
`kubectl get --raw` 276 / 282 ms: nvcli status / kubectl 5.1x / 3.0x (CPU 6.1x / 3.8x).
What is left of status is httpx, pydantic and building the agent's models.

Then `nvcli status` renders the agent's JSON without pydantic or the models (the other
commands still build them). On the real node (`--kubectl`, 30 rounds, load 0.6-0.9):
status 438 ms before that / 280 ms after, `kubectl get --raw` 78-85 ms: 5.2x / 3.4x.
Against the fake API server (kubectl slower there: 210 ms) 2.4x. What remains of
status's ~280 ms: the interpreter and site 37 ms (this checkout's editable-install hook
included), typer with click ~55, httpx with httpcore and h11 ~95, PyYAML for the
kubeconfig ~25, ssl ~20, then the request.

Then nvcli speaks HTTP with the standard library's http.client (cli/transport/http.py) instead of
httpx. On the real node (`--kubectl --before 682434e`, 30 rounds interleaved, load
~1.2 with the node running): status 257 ms before / 195 ms after, `kubectl get --raw`
83 ms: 3.10x / 2.36x (CPU 3.32x / 2.50x). Against the fake API server (20 rounds):
status 371 / 292 ms, kubectl 218-242 ms; `--help` and `version` 129 ms, 3.7x
`python -c pass` (typer and click are most of that). What is left of status: PyYAML
~15 ms, typer with click ~25, ssl and http.client's email parser ~15, the rest spread
thin over ~200 modules of the standard library.

Then the one-file nvcli (`--pyz`, 20 rounds, load 2.8-4.2 from other work; both on
/usr/bin/python3): nvcli.pyz / installed from the wheel, p50 wall (CPU): `version`
1.07x (1.04x), `--help` 1.03x (0.98x), `status` aggregated 1.04x (1.02x). A first try
with shiv's layout (every file an entry of the outer zip) took 180 ms for `version`
against 80 ms for this checkout's nvcli, in a quick check by hand, not this script: the
zip's directory of ~10,000 entries is read twice per run (cProfile), hence the nesting.

Then (issue 32 item 6, issue 33's split; `--before 31ec9f1`, 20 rounds interleaved, the
fake API server, load 5.3-6.6 from other work): status 240 ms, kubectl 201 ms, 1.19x wall
and 1.30x CPU (121 / 93 ms): one request each; the rest is start-up CPU (typer, click and
inspect ~30 ms, PyYAML ~9, ssl and http.client ~9, the kubeconfig parse ~3 and the TLS
context ~3). One module per command left start-up as it was: now / before p50 wall (CPU)
`--help` 0.98x (1.02x), `version` 0.94x (0.91x), `status` 0.98x (0.91x). The real node's
3.2x (issue 32) was not re-measured: the tier's lock was held by other runs.

Then (issue 32 item 6 again) a plain status line is answered without typer and click
(cli/statusline.py). On the real node (`--kubectl --before 5828744`, 20 rounds
interleaved, load 2.2-3.5 from other work): status 111 ms p50 against kubectl 69 ms,
1.61x wall, 1.72x CPU (94 / 55 ms); before 147 ms, 2.12x wall, 2.28x CPU. (With a reader of
kubectl's YAML without PyYAML an earlier run gave 1.37x; it was dropped: ~10 ms is not worth a
hand-written YAML parser.) Against the fake API server (`--before 5828744`, 15 rounds,
load 5.4, with that reader): status 0.66x wall, 0.55x CPU; `--help` 0.97x CPU,
`version` 0.99x CPU. Left: site (the editable-install hook), PyYAML,
http.client with its email parser, ssl, dataclasses with inspect, logging.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.stats import percentile, summary

REPO = Path(__file__).resolve().parents[1]
POD = "nb"
GPU = "nvidia.com/gpu=1"


def measure(
    found: dict[str, list[str]],
    iterations: int,
    env: dict[str, str],
    cwd: Path = REPO,
    cwds: dict[str, Path] | None = None,
) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Wall and CPU (user + system) time of each command as a new process, round-robin so
    that a change in the machine's load falls on every command alike; one untimed round
    first (page cache, .pyc). `cwds`: another working directory for some commands (an
    old tree: `python -m` imports from there first)."""
    wall: dict[str, list[float]] = {name: [] for name in found}
    cpu: dict[str, list[float]] = {name: [] for name in found}
    for round_ in range(iterations + 1):
        for name, command in found.items():
            where = (cwds or {}).get(name, cwd)
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            started = time.perf_counter()
            done = subprocess.run(command, capture_output=True, env=env, check=False, cwd=where)
            elapsed = time.perf_counter() - started
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            if done.returncode != 0:
                raise RuntimeError(f"{command}: exit {done.returncode}: {done.stderr.decode()}")
            if round_:
                wall[name].append(elapsed)
                used = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
                cpu[name].append(used)
    return wall, cpu


def commands(
    python: str, agent_url: str, token: str, config: Path, agent_ca: Path
) -> dict[str, list[str]]:
    nvcli = [python, "-m", "cli.main"]
    path = f"/apis/hotmount.io/v1alpha1/namespaces/default/gpumounts/{POD}"
    found = {
        "python -c pass": [python, "-c", "pass"],
        "nvcli --help": [*nvcli, "--help"],
        "nvcli version": [*nvcli, "version"],
        "nvcli status --agent (direct)": [
            *nvcli, "status", "--name", POD, "-n", "default", "--agent", agent_url,
            "--token", token, "--certificate-authority", str(agent_ca),
        ],
        "nvcli status (aggregated, kubeconfig)": [
            *nvcli, "status", "--name", POD, "--kubeconfig", str(config),
        ],
    }  # fmt: skip
    if shutil.which("kubectl"):
        found["kubectl get --raw (the same path)"] = [
            "kubectl", "--kubeconfig", str(config), "get", "--raw", path,
        ]  # fmt: skip
    return found


def zipapp_commands(
    pyz: Path, installed: Path, config: Path, system_python: str
) -> dict[str, list[str]]:
    """The one-file nvcli against nvcli installed from the same wheel, both on the system's
    python3 (`--pyz`): start-up alone, and a status through the API server."""
    status = ["status", "--name", POD, "--kubeconfig", str(config)]
    return {
        "python -c pass": [system_python, "-c", "pass"],
        "installed nvcli version": [str(installed), "version"],
        "nvcli.pyz version": [system_python, str(pyz), "version"],
        "installed nvcli --help": [str(installed), "--help"],
        "nvcli.pyz --help": [system_python, str(pyz), "--help"],
        "installed nvcli status (aggregated)": [str(installed), *status],
        "nvcli.pyz status (aggregated)": [system_python, str(pyz), *status],
    }


def install_from_wheel(wheel: Path, into: Path, python: str) -> Path:
    """nvcli as `pip install 'gpu-hotmount[cli]'` leaves it: a venv of `python`, compiled."""
    subprocess.run([python, "-m", "venv", str(into)], check=True)
    pip = [str(into / "bin" / "python"), "-m", "pip", "install", "-q", f"{wheel}[cli]"]
    subprocess.run(pip, check=True, capture_output=True)
    return into / "bin" / "nvcli"


def report_zipapp(wall: dict[str, list[float]], cpu: dict[str, list[float]]) -> None:
    report("the one-file nvcli (nvcli.pyz) next to nvcli installed from the wheel", wall, cpu)
    for what in ("version", "--help", "status (aggregated)"):
        for kind, samples in (("wall", wall), ("CPU", cpu)):
            ratio = percentile(samples[f"nvcli.pyz {what}"], 50) / percentile(
                samples[f"installed nvcli {what}"], 50
            )
            print(f"{f'ratio nvcli.pyz / installed, {what} ({kind})':<56} {ratio:8.2f}x")


def report(
    title: str, wall: dict[str, list[float]], cpu: dict[str, list[float]] | None = None
) -> None:
    print(f"\n{title}")
    for name, values in wall.items():
        print(summary(name, values))
    for name, values in (cpu or {}).items():
        print(summary(f"{name} (CPU)", values))
    floor = percentile(wall["python -c pass"], 50)
    for name, values in wall.items():
        if name != "python -c pass":
            ratio = percentile(values, 50) / floor
            print(f"{f'ratio {name} / python -c pass (p50)':<44} {ratio:8.1f}x")
    kubectl = "kubectl get --raw (the same path)"
    for kind, samples in (("wall", wall), ("CPU", cpu or {})):
        if kubectl not in samples:
            continue
        for nvcli in (n for n in samples if n.startswith("nvcli status (aggregated")):
            ratio = percentile(samples[nvcli], 50) / percentile(samples[kubectl], 50)
            label = nvcli.removeprefix("nvcli status (aggregated, kubeconfig)").strip()
            title = f"ratio nvcli status{f' {label}' if label else ''} / kubectl ({kind})"
            print(f"{title:<44} {ratio:8.2f}x")


def extract(rev: str, into: Path) -> Path:
    """`cli/`, `agent/` and `hotmount/` as they were at `rev`, importable ahead of the tree."""
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", rev, "cli", "agent", "hotmount"],
        capture_output=True,
        check=True,
    ).stdout
    into.mkdir(parents=True)
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    compile_bytecode(into)  # as this checkout's: compiled once, not on every run
    return into


def bench_fake_cluster(args: argparse.Namespace) -> None:
    import functools

    from tests.agent import conftest
    from tests.agent.conftest import ALICE, Cluster
    from tests.fakes.kube_apiserver import FakeKubeApiServer
    from tests.support.fixtures import STAND_IN_SPEC
    from tests.support.runc import make_rootfs, missing_requirements

    if why := missing_requirements():
        sys.exit(f"cli_bench: {why}")
    work = Path(tempfile.mkdtemp(prefix="nvcli-bench-"))
    # The tests' cluster, its API server on TLS: kubectl sends no token over plain HTTP.
    conftest.FakeKubeApiServer = functools.partial(  # type: ignore[misc]
        FakeKubeApiServer.with_tls, work / "pki"
    )
    (work / "cdi").mkdir()
    (work / "cdi" / "stand-in.yaml").write_text(STAND_IN_SPEC)
    cluster = Cluster(work, make_rootfs(work), work / "cdi")
    try:
        cluster.pod(POD)
        aggregated = cluster.aggregated_agent()
        config = cluster.kube.write_kubeconfig(work / "alice.kubeconfig", token=ALICE)
        env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
        env.pop("KUBECONFIG", None)
        python = sys.executable
        mount = [python, "-m", "cli.main", "mount", "--name", POD, "--mount", GPU,
                 "--kubeconfig", str(config)]  # fmt: skip
        subprocess.run(mount, env=env, check=True, capture_output=True, cwd=REPO)
        found = commands(python, aggregated.agent.url, ALICE, config, aggregated.serving.ca)
        uptime = subprocess.run(
            ["uptime"], capture_output=True, text=True, check=False
        ).stdout.strip()
        print(f"{args.iterations} runs each; {uptime}")
        if args.pyz:
            system_python = "/usr/bin/python3"
            installed = install_from_wheel(args.wheel, work / "installed", system_python)
            # The first run unpacks; the figures are of the runs after it, as a user's are.
            env["NVCLI_CACHE_DIR"] = str(work / "pyz-cache")
            subprocess.run([system_python, str(args.pyz), "version"], env=env, check=True)
            found = zipapp_commands(args.pyz, installed, config, system_python)
            report_zipapp(*measure(found, args.iterations, env))
            return
        cwds = {}
        if args.before:
            # `python -m` puts the working directory first on sys.path: the old tree's.
            # Interleaved with the others (one round-robin), so load falls on both alike.
            old = extract(args.before, work / "before")
            for name in [n for n in found if n.startswith("nvcli")]:
                found[f"{name} before: {args.before}"] = found[name]
                cwds[f"{name} before: {args.before}"] = old
        wall, cpu = measure(found, args.iterations, env, cwds=cwds)
        report("now" + (f", and before: {args.before}" if args.before else ""), wall, cpu)
        for name in [n for n in found if n.startswith("nvcli") and " before: " not in n]:
            for kind, samples in (("wall", wall), ("CPU", cpu)) if args.before else ():
                now, then = samples[name], samples[f"{name} before: {args.before}"]
                ratio = percentile(now, 50) / percentile(then, 50)
                print(f"{f'ratio now / before p50, {name} ({kind})':<64} {ratio:8.2f}x")
    finally:
        cluster.close()
        shutil.rmtree(work, ignore_errors=True)


def bench_real_node(args: argparse.Namespace) -> None:
    """The real-node tier: its API server, its aggregated APIService, a pod it runs."""
    config = os.environ.get("HOTMOUNT_K8S_KUBECONFIG")
    if not config:  # a node of our own, as the tier makes it (bench/tier_node.py)
        from bench.tier_node import tier_pod

        with tier_pod() as made:
            os.environ["HOTMOUNT_K8S_KUBECONFIG"] = str(made.kubeconfig)
            args.pod = f"{made.namespace}/{made.pod}"
            try:
                bench_real_node(args)
            finally:
                del os.environ["HOTMOUNT_K8S_KUBECONFIG"]
        return
    namespace, pod = args.pod.split("/", 1) if "/" in args.pod else ("default", args.pod)
    path = f"/apis/hotmount.io/v1alpha1/namespaces/{namespace}/gpumounts/{pod}"
    env = {**os.environ, "KUBECONFIG": config}
    python = sys.executable
    status = [python, "-m", "cli.main", "status", "--name", pod, "-n", namespace]
    found = {
        "python -c pass": [python, "-c", "pass"],
        "nvcli status (aggregated, kubeconfig)": status,
        "kubectl get --raw (the same path)": ["kubectl", "get", "--raw", path],
    }
    cwds = {}
    if args.before:  # interleaved with the others, from the old tree
        before = f"nvcli status (aggregated, kubeconfig) before: {args.before}"
        found[before] = status
        cwds[before] = extract(args.before, Path(tempfile.mkdtemp(prefix="nvcli-bench-")) / "old")
    uptime = subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout
    print(f"{args.iterations} runs each; {uptime.strip()}")
    try:
        report(f"real node, {path}", *measure(found, args.iterations, env, cwds=cwds))
    finally:
        for old in cwds.values():
            shutil.rmtree(old.parent, ignore_errors=True)


def compile_bytecode(root: Path = REPO) -> None:
    """As an installed nvcli has it (pip compiles on install): the tree's modules compiled
    once, since PYTHONDONTWRITEBYTECODE (set on these machines) would otherwise have every
    run compile them from source again."""
    import compileall

    for package in ("cli", "agent", "hotmount"):
        compileall.compile_dir(root / package, quiet=1)
    print(f"bytecode: {root}'s cli/, agent/, hotmount/ compiled first, as installed")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--iterations", type=int, default=30)
    parser.add_argument("--before", metavar="REV", help="also time cli/ of this git revision")
    parser.add_argument("--kubectl", action="store_true", help="the real-node tier instead")
    parser.add_argument("--pod", default="default/gpu-pod", help="--kubectl: NAMESPACE/POD")
    parser.add_argument(
        "--pyz", type=Path, help="time this nvcli.pyz against an install of --wheel instead"
    )
    parser.add_argument("--wheel", type=Path, help="--pyz: the wheel it was built with")
    args = parser.parse_args()
    if args.pyz and not args.wheel:
        parser.error("--pyz needs --wheel (bash scripts/build-cli.sh writes both to dist/)")
    compile_bytecode()
    if args.kubectl:
        bench_real_node(args)
    else:
        bench_fake_cluster(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
