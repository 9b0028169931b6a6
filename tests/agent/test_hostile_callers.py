"""The agent under hostile callers, through real agent processes and the fake API server.

- authentication comes before the body: 401 whatever is sent, however much;
- bodies over the cap get 413 without being read to the end (Content-Length or chunked);
- probes answer while every worker is stuck on a hung API server;
- mutating calls past their bound wait in line for a slot (and are served when one frees),
  or get 429 + Retry-After once they have waited --mutating-wait; calls past the overall
  bound get 429 at once;
- a Kubernetes call, or a call to another agent, that gets no answer times out (502),
  never holds a worker for good;
- a refused token is not sent to TokenReview again and again, and distinct junk tokens
  get 429 past --max-token-reviews instead of taking the workers from known callers;
- forwarded calls carry the caller's uid and extras into the other agent's SAR.

Raw sockets send what httpx would not: a Content-Length promising a gigabyte, or a
chunked body that never ends. Each exchange has a socket timeout only so that a
regression fails instead of hanging; no assertion depends on timing.
"""

from __future__ import annotations

import json
import queue
import socket
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from hotmount.state.ledger import Ledger
from tests.agent.conftest import ALICE, BOB, METRICS, Cluster
from tests.agent.test_auth import assert_status
from tests.fakes.kube_apiserver import Stall
from tests.support.agent import (
    GPUS,
    AgentProcess,
    agent_pod_manifest,
    pod_manifest,
    standalone_agent,
    write_driver_tree,
)
from tests.support.runc import RuncContainer
from tests.support.waiting import wait_for

pytestmark = pytest.mark.kernel
MOUNT = "/v1/namespaces/default/pods/nb/devices"
CAP = 65536
STUCK = ["--kube-timeout", "600"]  # stalled calls stay stuck until the test releases them


def exchange(
    agent: AgentProcess, head: str, parts: Iterable[bytes] = ()
) -> tuple[int, dict[str, str], dict[str, Any]]:
    """Send a request head and some body parts (maybe not all the body); read the answer."""
    with socket.create_connection(("127.0.0.1", agent.port), timeout=30) as sock:
        sock.sendall(head.replace("\n", "\r\n").encode() + b"\r\n")
        for part in parts:
            sock.sendall(part)
        reader = sock.makefile("rb")
        status = int(reader.readline().split()[1])
        headers = {}
        while (line := reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.decode().partition(":")
            headers[name.strip().lower()] = value.strip()
        body = json.loads(reader.read(int(headers["content-length"])))
    return status, headers, body


def head(path: str, token: str | None, *fields: str) -> str:
    lines = [f"POST {path} HTTP/1.1", "Host: agent", "Content-Type: application/json", *fields]
    if token:
        lines.append(f"Authorization: Bearer {token}")
    return "\n".join(lines) + "\n"


def chunks(total: int, size: int = 8192) -> Iterator[bytes]:
    """A chunked body of `total` bytes, never terminated (no final 0-chunk)."""
    for _ in range(total // size):
        yield f"{size:x}\r\n".encode() + b" " * size + b"\r\n"


@contextmanager
def in_flight(
    agent: AgentProcess, stall: Stall, count: int, method: str = "POST"
) -> Iterator[list]:
    """`count` calls to MOUNT stuck in the agent (on `stall`) for the duration of the block."""
    answers: list[httpx.Response | Exception] = []

    def call() -> None:
        try:
            with agent.client(ALICE) as api:
                answers.append(api.request(method, MOUNT, json={"devices": ["0"]}))
        except httpx.HTTPError as exc:
            answers.append(exc)

    threads = [threading.Thread(target=call) for _ in range(count)]
    for thread in threads:
        thread.start()
    try:
        yield answers
    finally:
        stall.release()
        for thread in threads:
            thread.join()


# -- authentication before the body -----------------------------------------------------------


def test_unauthenticated_calls_get_401_whatever_the_body(cluster: Cluster) -> None:
    agent = cluster.agent()
    with agent.client() as anonymous:
        for content in (b"{not json", b'{"devices": 7}', b"", b" " * (CAP + 1)):
            answer = anonymous.post(
                MOUNT, content=content, headers={"content-type": "application/json"}
            )
            assert_status(answer, 401, "Unauthorized")
    with agent.client("no-such-token") as stranger:
        assert_status(stranger.post(MOUNT, content=b"{not json"), 401, "Unauthorized")

    # A gigabyte promised, a kilobyte sent: the answer comes without waiting for the rest.
    gigabyte = "Content-Length: 1073741824"
    for token in (None, "no-such-token"):
        status, _, body = exchange(agent, head(MOUNT, token, gigabyte), [b"{" * 1024])
        assert (status, body["reason"]) == (401, "Unauthorized")
    status, _, body = exchange(
        agent, head(MOUNT, None, "Transfer-Encoding: chunked"), chunks(CAP * 2)
    )
    assert (status, body["reason"]) == (401, "Unauthorized")


# -- the body cap -----------------------------------------------------------------------------


def test_bodies_over_the_cap_get_413_without_being_read_whole(cluster: Cluster) -> None:
    agent = cluster.agent()

    status, _, body = exchange(agent, head(MOUNT, ALICE, "Content-Length: 1073741824"), [b"{"])
    assert (status, body["reason"]) == (413, "RequestEntityTooLarge")
    assert str(CAP) in body["message"]

    # chunked: counted as it arrives, answered while the body has not ended
    status, _, body = exchange(
        agent, head(MOUNT, ALICE, "Transfer-Encoding: chunked"), chunks(CAP + 16384)
    )
    assert (status, body["reason"]) == (413, "RequestEntityTooLarge")

    with agent.client(ALICE) as alice:
        over = alice.post(MOUNT, content=b" " * (CAP + 1))
        assert_status(over, 413, "RequestEntityTooLarge")
        # exactly at the cap: read, parsed and served (the pod does not exist)
        document = b'{"devices": ["0"]}'
        at_cap = alice.post(
            "/v1/namespaces/default/pods/ghost/devices",
            content=document + b" " * (CAP - len(document)),
            headers={"content-type": "application/json"},
        )
        assert at_cap.status_code == 404, at_cap.text
        assert at_cap.json()["reason"] == "PodNotFound"


# -- health and bounded concurrency -----------------------------------------------------------


def test_probes_answer_while_every_worker_is_stuck(cluster: Cluster) -> None:
    """45 mounts hang on a stalled API server: more than the agent has worker threads (40)."""
    cluster.kube.put_pod(pod_manifest("nb", None))
    bounds = ["--max-mutating", "64", "--max-requests", "64", "--max-mutating-per-caller", "64"]
    # The fixture caches no review (--authz-cache-ttl 0): each of the 45 is reviewed.
    bounds += ["--max-token-reviews", "64"]
    agent = cluster.agent(extra=[*STUCK, *bounds])
    stall = cluster.kube.stall(verb="get", resource="pods")
    with in_flight(agent, stall, 45):
        assert stall.wait_arrived(40), f"only {stall.arrived} calls reached the API server"
        with httpx.Client(base_url=agent.url, timeout=30) as probe:
            assert probe.get("/healthz").status_code == 200
            ready = probe.get("/readyz")
            assert ready.status_code == 200, ready.text


def test_mutating_calls_past_the_bound_get_429(cluster: Cluster) -> None:
    cluster.kube.put_pod(pod_manifest("nb", None))
    agent = cluster.agent(extra=[*STUCK, "--max-mutating", "2", "--mutating-wait", "0"])
    stall = cluster.kube.stall(verb="get", resource="pods")
    with in_flight(agent, stall, 2):
        assert stall.wait_arrived(2)
        with agent.client(ALICE) as alice:
            for extra_call in (
                alice.post(MOUNT, json={"devices": ["1"]}),
                alice.delete(f"{MOUNT}/0"),
            ):
                refused = assert_status(extra_call, 429, "TooManyRequests")
                assert extra_call.headers["retry-after"] == "1"
                assert refused["details"]["retryAfterSeconds"] == 1
            listed = alice.get("/v1/devices")  # reads are not mutating work
            assert listed.status_code == 200, listed.text
        with httpx.Client(base_url=agent.url, timeout=30) as probe:
            assert probe.get("/healthz").status_code == 200
            assert probe.get("/readyz").status_code == 200
    with agent.client(ALICE) as alice:  # the slots are free again
        after = alice.post(MOUNT, json={"devices": ["1"]})
        assert after.status_code != 429, after.text


def gauge(agent: AgentProcess, name: str) -> float:
    with agent.client(METRICS) as scraper:
        for line in scraper.get("/metrics").text.splitlines():
            if line.startswith(f"{name} "):
                return float(line.split()[1])
    raise AssertionError(f"no {name} in /metrics")


def test_a_mutating_call_past_the_bound_waits_in_line_and_is_served(cluster: Cluster) -> None:
    """Past --max-mutating a mount waits for a slot, holding no worker thread, and is
    served when the slot frees: not a 429 its caller would have to retry."""
    cluster.kube.put_pod(pod_manifest("nb", None))
    agent = cluster.agent(extra=[*STUCK, "--max-mutating", "1"])
    stall = cluster.kube.stall(verb="get", resource="pods")
    later: list[httpx.Response] = []

    def second_call() -> None:
        with agent.client(ALICE) as alice:
            later.append(alice.post(MOUNT, json={"devices": ["1"]}))

    waiter = threading.Thread(target=second_call)
    with in_flight(agent, stall, 1) as first:
        assert stall.wait_arrived(1)
        waiter.start()
        wait_for(
            lambda: gauge(agent, "hotmount_mutating_waiting") == 1,
            "the agent to count the second call in line (hotmount_mutating_waiting 1)",
            timeout=30,
            show=lambda: gauge(agent, "hotmount_mutating_waiting"),
        )
        assert stall.arrived == 1, "the second call must wait, not run beside the first"
    waiter.join()
    [answer] = later
    assert answer.status_code != 429, answer.text
    assert stall.arrived == 2  # it ran once the first call freed the slot
    assert [a.status_code for a in first] == [answer.status_code]
    assert gauge(agent, "hotmount_mutating_waiting") == 0


def test_a_mutating_call_that_waits_past_mutating_wait_gets_429_not_a_late_answer(
    cluster: Cluster,
) -> None:
    """A call still in line after --mutating-wait is refused then: it must not run later,
    once the slot frees, for a caller that has already been told to retry."""
    cluster.kube.put_pod(pod_manifest("nb", None))
    agent = cluster.agent(extra=[*STUCK, "--max-mutating", "1", "--mutating-wait", "0.5"])
    stall = cluster.kube.stall(verb="get", resource="pods")
    with in_flight(agent, stall, 1) as first:
        assert stall.wait_arrived(1)
        with agent.client(ALICE) as alice:
            late = alice.post(MOUNT, json={"devices": ["1"]})

        refused = assert_status(late, 429, "TooManyRequests")
        assert late.headers["retry-after"] == "1"
        assert "0.5 s in line" in refused["message"]
        assert gauge(agent, "hotmount_mutating_waiting") == 0
    assert [a.status_code for a in first] != [429]
    assert stall.arrived == 1, "the refused call must never reach the API server"


def test_one_caller_cannot_fill_the_mutating_line(cluster: Cluster) -> None:
    """bob (no RBAC at all) floods mounts that hang in their authorization. He gets at most
    --max-mutating-per-caller of them in the agent, the rest 429 at once; alice's mount
    still gets a slot and is served."""
    nb = cluster.pod("nb")
    agent = cluster.agent(extra=[*STUCK, "--authz-cache-ttl", "600"])  # 8 slots, 4 per caller
    with agent.client(ALICE) as alice:
        warm = alice.post(MOUNT, json={"devices": ["0"]})  # alice's decision is cached
        assert warm.status_code == 200, warm.text
    stall = cluster.kube.stall(verb="create", api_group="*", resource="subjectaccessreviews")
    answers: queue.Queue[httpx.Response | Exception] = queue.Queue()

    def flood() -> None:
        try:
            with agent.client(BOB) as bob:
                answers.put(bob.post(MOUNT, json={"devices": ["1"]}))
        except httpx.HTTPError as exc:
            answers.put(exc)

    threads = [threading.Thread(target=flood) for _ in range(8)]  # as many as the slots
    for thread in threads:
        thread.start()
    try:
        assert stall.wait_arrived(4)
        for _ in range(4):  # the four past bob's bound, answered without waiting
            refused = answers.get(timeout=30)
            assert isinstance(refused, httpx.Response), refused
            body = assert_status(refused, 429, "TooManyRequests")
            assert refused.headers["retry-after"] == "1"
            assert "limit per caller" in body["message"]
        assert stall.arrived == 4

        with agent.client(ALICE) as alice:
            served = alice.post(MOUNT, json={"devices": ["1"]})

        assert served.status_code == 200, served.text
        assert f"nvidia{GPUS[1].minor}" in nb.ls_dev()
    finally:
        stall.release()
        for thread in threads:
            thread.join()
    late = [answers.get_nowait() for _ in range(4)]
    assert [getattr(a, "status_code", a) for a in late] == [403] * 4


def test_calls_past_the_overall_bound_get_429(cluster: Cluster) -> None:
    cluster.kube.put_pod(pod_manifest("nb", None))
    agent = cluster.agent(extra=[*STUCK, "--max-requests", "2"])
    stall = cluster.kube.stall(verb="get", resource="pods")
    with in_flight(agent, stall, 2, method="GET"):
        assert stall.wait_arrived(2)
        with agent.client(ALICE) as alice:
            refused = alice.get("/v1/devices")
            assert_status(refused, 429, "TooManyRequests")
            assert refused.headers["retry-after"] == "1"
        with httpx.Client(base_url=agent.url, timeout=30) as probe:
            assert probe.get("/healthz").status_code == 200


# -- timeouts and the TokenReview flood -------------------------------------------------------


def test_a_hung_api_server_costs_a_timeout_not_a_worker(cluster: Cluster) -> None:
    cluster.kube.put_pod(pod_manifest("nb", None))
    agent = cluster.agent(extra=["--kube-timeout", "1"])
    stall = cluster.kube.stall(verb="get", resource="pods")
    try:
        with agent.client(ALICE) as alice:
            answer = alice.post(MOUNT, json={"devices": ["0"]})
        body = assert_status(answer, 502, "UpstreamError")
        assert "reading pod default/nb" in body["message"]
        assert stall.arrived == 1  # a read timeout is not retried
    finally:
        stall.release()


def test_an_event_that_cannot_be_written_does_not_fail_a_done_mount(cluster: Cluster) -> None:
    """The Event comes after the work: a hung Events API must not turn a mount into a 500."""
    container = cluster.pod("nb")
    agent = cluster.agent(extra=["--kube-timeout", "1"])
    stall = cluster.kube.stall(verb="create", resource="events")
    try:
        with agent.client(ALICE) as alice:
            answer = alice.post(MOUNT, json={"devices": ["nvidia.com/gpu=1"]})
        assert answer.status_code == 200, answer.text
        assert stall.arrived == 1
        assert container.open_result("/dev/nvidia1") == "OK"  # granted, as answered
    finally:
        stall.release()


def test_a_hung_agent_costs_a_timeout_not_a_worker(cluster: Cluster) -> None:
    """node-b's "agent" accepts connections and never answers."""
    with socket.socket() as hung:
        hung.bind(("127.0.0.1", 0))
        hung.listen(16)  # the kernel completes handshakes; nobody ever reads
        cluster.kube.put_pod(pod_manifest("nb", None, node="node-b"))
        cluster.kube.put_pod(agent_pod_manifest("node-b", hung.getsockname()[1]))
        node_a = cluster.agent("node-a", extra=["--agent-timeout", "1"])
        with node_a.client(ALICE) as alice:
            answer = alice.post(MOUNT, json={"devices": ["0"]})
    body = assert_status(answer, 502, "UpstreamError")
    assert "forwarding to the agent on node-b" in body["message"]


def test_a_refused_token_is_not_reviewed_again_and_again(cluster: Cluster) -> None:
    agent = cluster.agent()

    def reviews_of(token: str) -> int:
        return sum(1 for r in cluster.kube.reviews("TokenReview") if r["spec"]["token"] == token)

    with agent.client("bad-token") as flood:
        for _ in range(50):
            assert_status(flood.get("/v1/devices"), 401, "Unauthorized")
    assert reviews_of("bad-token") == 1
    with agent.client(ALICE) as alice:  # good callers are unaffected
        assert alice.get("/v1/devices").status_code == 200


def test_distinct_junk_tokens_cannot_starve_an_authenticated_caller(cluster: Cluster) -> None:
    """300 distinct junk tokens while TokenReview hangs: at most --max-token-reviews of them
    are reviewed at once (on threads of their own), the rest get 429 with no review, and
    a caller the agent already knows is answered while the reviews still hang. Without the
    bound the junk takes every worker thread and alice waits for the API server."""
    bound, junk = 8, 300
    agent = cluster.agent(
        extra=[*STUCK, "--authz-cache-ttl", "600", "--max-token-reviews", str(bound)]
    )
    with agent.client(ALICE) as alice:  # reviewed and authorized once: now known
        assert alice.get("/v1/devices").status_code == 200
    stall = cluster.kube.stall(
        verb="create", api_group="authentication.k8s.io", resource="tokenreviews"
    )
    answers: queue.Queue[httpx.Response | Exception] = queue.Queue()

    def call(token: str) -> None:
        headers = {"authorization": f"Bearer {token}"}
        try:
            with httpx.Client(base_url=agent.url, headers=headers, timeout=120) as caller:
                answers.put(caller.get("/v1/devices"))
        except httpx.HTTPError as exc:
            answers.put(exc)

    threads = [threading.Thread(target=call, args=(f"junk-{n}",)) for n in range(junk)]
    try:
        for thread in threads:
            thread.start()
        assert stall.wait_arrived(bound), f"only {stall.arrived} reviews reached the API server"
        with agent.client(ALICE) as alice:  # every junk review still hangs on the stall
            served = alice.get("/v1/devices")
        assert served.status_code == 200, served.text
        refused = [answers.get() for _ in range(junk - bound)]  # answered before the release
        for answer in refused:
            assert isinstance(answer, httpx.Response), answer
            assert_status(answer, 429, "TooManyRequests")
            assert answer.headers["retry-after"] == "1"
        assert stall.arrived == bound  # the refused ones cost no review
    finally:
        stall.release()
        for thread in threads:
            thread.join()
    reviewed = [answers.get_nowait() for _ in range(bound)]
    for answer in reviewed:
        assert isinstance(answer, httpx.Response), answer
        assert_status(answer, 401, "Unauthorized")


def test_a_burst_with_one_new_token_costs_one_review_and_no_429(cluster: Cluster) -> None:
    """Five times --max-token-reviews calls, all with one token the agent has not seen, while
    TokenReview hangs: one review goes out, the rest wait for it without taking a slot
    (no 429), and every call is answered once it returns. Without the wait each call
    would send its own review, and those past the bound would get 429."""
    bound, burst = 4, 20
    agent = cluster.agent(
        extra=[*STUCK, "--authz-cache-ttl", "600", "--max-token-reviews", str(bound)]
    )
    waiting = 'hotmount_token_reviews{state="waiting"}'
    assert gauge(agent, waiting) == 0  # and the scraper's own token is known from now on
    stall = cluster.kube.stall(
        verb="create", api_group="authentication.k8s.io", resource="tokenreviews"
    )
    answers: queue.Queue[httpx.Response | Exception] = queue.Queue()

    def call() -> None:
        try:
            with agent.client(ALICE) as alice:
                answers.put(alice.get("/v1/devices"))
        except httpx.HTTPError as exc:
            answers.put(exc)

    threads = [threading.Thread(target=call) for _ in range(burst)]
    try:
        for thread in threads:
            thread.start()
        assert stall.wait_arrived(1)
        wait_for(lambda: gauge(agent, waiting) == burst - 1, "the burst waits for one review")
        assert stall.arrived == 1
        assert answers.empty()
    finally:
        stall.release()
        for thread in threads:
            thread.join()
    for _ in range(burst):
        answer = answers.get_nowait()
        assert isinstance(answer, httpx.Response) and answer.status_code == 200, answer


# -- forwarding keeps the whole identity ------------------------------------------------------


def test_forwarded_calls_carry_uid_and_extra_into_the_sar(cluster: Cluster) -> None:
    extra = {
        "authentication.kubernetes.io/pod-name": ["notebook-0"],
        "Example.COM/Scopes": ["read write", "ünïcode/äll"],
    }
    cluster.kube.add_token("carol-token", "carol", ["ml"], uid="carol-uid-7", extra=extra)
    container = cluster.pod("nb", node="node-b")
    node_a, node_b = cluster.agent("node-a"), cluster.agent("node-b")

    with node_a.client("carol-token") as carol:
        mounted = carol.post(MOUNT, json={"devices": ["0"]})
    assert mounted.status_code == 200, mounted.text
    assert container.open_result("/dev/nvidia3") == "ENXIO"

    reviews = [r["spec"] for r in cluster.kube.reviews("SubjectAccessReview")]
    carols = [r for r in reviews if r["user"] == "carol"]
    assert len(carols) >= 2  # node-a's own check, then node-b's for the asserted carol
    for review in carols:
        assert review["uid"] == "carol-uid-7"
        assert review["extra"] == extra
        assert "ml" in review["groups"]
    # her token is good for the API server (no --token-audiences): asserted, not forwarded
    log = node_b.log.read_text().splitlines()
    assert [e for e in log if "allow user=carol via=gateway" in e]


def test_the_nodes_own_operator_is_not_bounded_per_caller(
    tmp_path: Path, rootfs: Path, cdi_dir: Path
) -> None:
    """The static token is the node's one operator (no RBAC applies): with a per-caller
    bound of 1, two of its mounts both get in and both are served; the agent-wide bounds
    still hold. The mounts are held inside the agent by the ledger's claims lock."""
    containers = [RuncContainer(tmp_path, rootfs, "v1") for _ in range(2)]
    state = tmp_path / "state"
    (tmp_path / "token").write_text("operator-token\n")
    agent = standalone_agent(
        tmp_path,
        write_driver_tree(tmp_path / "driver"),
        cdi_dir,
        ["--token-file", str(tmp_path / "token"), "--max-mutating-per-caller", "1"],
        state_dir=state,
    )
    answers: queue.Queue[httpx.Response | Exception] = queue.Queue()

    def mount(container: RuncContainer, device: str) -> None:
        try:
            with agent.client("operator-token") as api:
                path = f"/v1/containers/{container.id}/devices"
                answers.put(api.post(path, json={"devices": [device]}))
        except httpx.HTTPError as exc:
            answers.put(exc)

    def in_agent() -> float:
        with agent.client("operator-token") as api:
            text = api.get("/metrics").text
        return sum(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith("hotmount_requests_in_agent ")
        )

    def both_in() -> bool:
        if in_agent() >= 2:
            return True
        assert answers.empty(), "refused while the other mount was in the agent"
        return False

    try:
        with Ledger(state).claims_lock():
            threads = [
                threading.Thread(target=mount, args=(c, d))
                for c, d in zip(containers, ("0", "1"), strict=True)
            ]
            for thread in threads:
                thread.start()
            wait_for(both_in, "the two mounts to be in the agent at once", timeout=30, interval=0.1)
        for thread in threads:
            thread.join()
        got = [answers.get_nowait() for _ in range(2)]
        assert [getattr(a, "status_code", a) for a in got] == [200, 200], got
    finally:
        agent.stop()
        for container in containers:
            container.stop()
