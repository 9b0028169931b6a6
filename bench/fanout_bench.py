"""A list across N nodes: one real agent fans out to N simulated agents.

    sudo .venv/bin/python -m bench.fanout_bench [--sizes 10,100,500] [--lists 15]

The real agent (a `hotmount-agent` process, TLS, the fake API server of tests/fakes)
lists `nodedevices` for alice. The API server lists N more agent pods, on loopback
addresses (127.0.0.0/8); behind them, in a second process, light TLS servers answer
with one node's NodeDevices of 8 GPUs (the real agent's own device JSON, copied), over
keep-alive connections. Each size runs twice: all healthy, then with 5% of the pods on
addresses where nothing listens (refused) and 1% on sockets that accept and never
answer (hung; at least one of each). Prints p50/p99 wall per list, what the answer
named as missing (all of the broken ones must be named), and the requests the API server
saw per list. Goals on a 2-core machine: p50 <= 1 s at 500 healthy; with dead and hung
ones <= --list-timeout + 0.5 s.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import resource
import socket
import ssl
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.stats import percentile
from tests.agent.conftest import ALICE, Cluster
from tests.fakes.pki import CertificateAuthority
from tests.support.fixtures import STAND_IN_SPEC

AGG = "/apis/hotmount.io/v1alpha1/nodedevices"
PEER_PORT = 9443
SERVER_NAME = "gpu-hotmount.gpu-hotmount.svc"  # the agents' Service name (SNI), the default
LIST_TIMEOUT = 2.0


def healthy_ip(i: int) -> str:
    return f"127.1.{i // 250}.{i % 250 + 1}"


def refused_ip(i: int) -> str:
    return f"127.2.{i // 250}.{i % 250 + 1}"


def hung_ip(i: int) -> str:
    return f"127.3.{i // 250}.{i % 250 + 1}"


# -- the simulated agents (a process of their own) ---------------------------------------------


async def serve_peers(count: int, hung: int, cert: str, key: str, payload: Path) -> None:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    template = json.loads(payload.read_text())
    bodies: dict[str, bytes] = {}
    for i in range(count):
        node = json.loads(json.dumps(template))
        node["metadata"]["name"] = node["status"]["node"] = f"sim-{i}"
        body = {"apiVersion": "hotmount.io/v1alpha1", "kind": "NodeDevicesList",
                "metadata": {}, "items": [node]}  # fmt: skip
        bodies[healthy_ip(i)] = json.dumps(body).encode()

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        body = bodies[writer.get_extra_info("sockname")[0]]
        head = (
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\n\r\n"
        ).encode()
        try:
            while True:
                request = await reader.readuntil(b"\r\n\r\n")
                if not request:
                    break
                writer.write(head + body)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, ssl.SSLError):
            pass
        finally:
            writer.close()

    servers = [
        await asyncio.start_server(answer, healthy_ip(i), PEER_PORT, ssl=context, backlog=256)
        for i in range(count)
    ]
    silent = []  # accept nothing: the kernel completes the TCP handshake, TLS never starts
    for i in range(hung):
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((hung_ip(i), PEER_PORT))
        s.listen(1024)
        silent.append(s)
    print("ready", flush=True)
    await asyncio.gather(*(s.serve_forever() for s in servers))


# -- the run ------------------------------------------------------------------------------------


def agent_pod(name: str, node: str, ip: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": "gpu-hotmount",
            "labels": {"app.kubernetes.io/name": "gpu-hotmount"},
        },
        "spec": {
            "nodeName": node,
            "containers": [
                {"name": "agent", "ports": [{"name": "https", "containerPort": PEER_PORT}]}
            ],
        },
        "status": {"phase": "Running", "podIP": ip},
    }


def scenario(cluster: Cluster, n: int, broken: bool) -> tuple[set[str], dict[str, str]]:
    """Register n agent pods; return the nodes that must answer and those that must not."""
    refused = math.ceil(n * 0.05) if broken else 0
    hung = math.ceil(n * 0.01) if broken else 0
    with cluster.kube._lock:  # the bench's own reset of the fake's store
        for key in [k for k in cluster.kube._store["pods"] if k[1].startswith("sim-")]:
            del cluster.kube._store["pods"][key]
    expected: dict[str, str] = {}
    for i in range(n):
        node = f"sim-{i}"
        if i < refused:
            ip = refused_ip(i)
            expected[node] = "Refused"
        elif i < refused + hung:
            ip = hung_ip(i - refused)
            expected[node] = "Timeout"
        else:
            ip = healthy_ip(i)
        cluster.kube.put_pod(agent_pod(node, node, ip))
    answering = {f"sim-{i}" for i in range(n)} - expected.keys() | {"node-a"}
    return answering, expected


def run(sizes: list[int], lists: int, work: Path) -> None:
    cdi = work / "cdi"
    cdi.mkdir()
    (cdi / "stand-in.yaml").write_text(STAND_IN_SPEC)
    cluster = Cluster(work, work, cdi, tls=False)
    ca = CertificateAuthority(work / "agents-pki", "agents-ca")
    serving = ca.issue_server("agent", hosts=(SERVER_NAME, "127.0.0.1"))
    peers: subprocess.Popen[str] | None = None
    try:
        agent = cluster.agent(
            "node-a",
            extra=["--authz-cache-ttl", "60", "--reconcile-interval", "3600",
                   "--agent-ca", str(ca.cert_path), "--log-level", "WARNING",
                   "--list-timeout", str(LIST_TIMEOUT)],
            tls=serving,
        )  # fmt: skip
        with agent.client(ALICE) as api:
            own = api.get(AGG).json()["items"][0]
        gpu = own["status"]["devices"][0]
        own["status"]["devices"] = [
            {**gpu, "index": i, "key": f"GPU-{i:08d}-0000-4000-8000-000000000000",
             "uuid": f"GPU-{i:08d}-0000-4000-8000-000000000000"}
            for i in range(8)
        ]  # fmt: skip
        payload = work / "node.json"
        payload.write_text(json.dumps(own))
        biggest = max(sizes)
        peers = subprocess.Popen(
            [sys.executable, "-m", "bench.fanout_bench", "--serve-peers", str(biggest),
             "--hung", str(math.ceil(biggest * 0.01)), "--cert", str(serving.cert),
             "--key", str(serving.key), "--payload", str(payload)],
            stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert peers.stdout is not None and peers.stdout.readline().strip() == "ready"
        print(f"payload per node: {len(payload.read_bytes())} bytes (8 GPUs)")
        print(f"{'nodes':>6} {'broken':>16} {'p50 s':>7} {'p99 s':>7} {'max s':>7} "
              f"{'missing named':>14} {'API req/list':>13}")  # fmt: skip
        with agent.client(ALICE) as api:
            for n in sizes:
                for broken in (False, True):
                    answering, expected = scenario(cluster, n, broken)
                    api.get(AGG)  # the first list opens the connections
                    walls, named_ok = [], True
                    before = len(cluster.kube.requests())
                    for _ in range(lists):
                        started = time.perf_counter()
                        answer = api.get(AGG, timeout=60)
                        walls.append(time.perf_counter() - started)
                        body = answer.json()
                        got = {i["metadata"]["name"] for i in body["items"]}
                        missing = {
                            m["node"]: m["reason"] for m in body["metadata"].get("missingNodes", [])
                        }
                        named_ok &= got == answering and missing == expected
                    per_list = (len(cluster.kube.requests()) - before) / lists
                    label = (
                        f"{sum(r == 'Refused' for r in expected.values())} refused, "
                        f"{sum(r == 'Timeout' for r in expected.values())} hung"
                        if broken
                        else "none"
                    )
                    print(
                        f"{n:>6} {label:>16} {percentile(walls, 50):7.3f} "
                        f"{percentile(walls, 99):7.3f} {max(walls):7.3f} "
                        f"{('all ' + str(len(expected))) if named_ok else 'WRONG':>14} "
                        f"{per_list:>13.1f}",
                        flush=True,
                    )
    finally:
        if peers is not None:
            peers.terminate()
            peers.wait()
        cluster.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10,100,500")
    parser.add_argument("--lists", type=int, default=15, help="lists timed per scenario")
    parser.add_argument("--serve-peers", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--hung", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--cert", help=argparse.SUPPRESS)
    parser.add_argument("--key", help=argparse.SUPPRESS)
    parser.add_argument("--payload", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    if args.serve_peers is not None:
        asyncio.run(serve_peers(args.serve_peers, args.hung, args.cert, args.key, args.payload))
        return
    with tempfile.TemporaryDirectory(prefix="fanout-bench-") as work:
        run([int(s) for s in args.sizes.split(",")], args.lists, Path(work))


if __name__ == "__main__":
    main()
