"""nvcli's sharing flags: `--container` repeated or `'*'`, and `--share-with POD`.

What nvcli sends (the stub agent validates it against `MountRequest`), what it prints
of the agent's answer, and bad names refused as usage errors before any request.
The last test runs them against the real agent and two-container runc pods.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from tests.agent.conftest import ALICE
from tests.agent.conftest import Cluster as RealCluster
from tests.agent.test_one_device_one_claim import two_container_pod
from tests.cli.conftest import AGENT_TOKEN, Cluster, Run
from tests.cli.stub_agent import CONTAINER_ID, GPUS, StubAgent, container_id
from tests.support.agent import GPUS as REAL_GPUS

Nvcli = Callable[..., Run]
UUID0 = GPUS[0]["uuid"]
MOUNT = ["mount", "--name", "nb-0", "--mount", "0"]


def table_column(out: str, name: str) -> list[str]:
    """The cells of column `name` in nvcli's table output, one per row (columns are
    left-aligned under their header, so each runs from its header to the next one)."""
    header, *rows = out.splitlines()
    names = [n for n in header.split("  ") if n.strip()]
    starts = [header.index(n.strip()) for n in names]
    at = [n.strip() for n in names].index(name)
    end = starts[at + 1] if at + 1 < len(starts) else None
    return [row[starts[at] : end].strip() for row in rows]


def agent_args(stub: StubAgent) -> list[str]:
    return ["--agent", stub.url, "--token", AGENT_TOKEN, "-n", "ml"]


BODIES = {
    "two-named": (["--container", "a", "--container", "b"], {"containers": ["a", "b"]}),
    "star": (["--container", "*"], {"containers": ["*"]}),
    "one-repeated": (["--container", "a", "--container", "a"], {"container": "a"}),
    "share-with": (["--share-with", "other"], {"shareWith": "other"}),
}


@pytest.mark.parametrize(("flags", "sent"), BODIES.values(), ids=BODIES.keys())
def test_the_request_body(nvcli: Nvcli, stub: StubAgent, flags: list[str], sent: dict) -> None:
    run = nvcli(*MOUNT, *flags, *agent_args(stub))
    assert run.rc == 0, run.err
    (req,) = stub.received
    assert (req.method, req.path) == ("POST", "/v1/namespaces/ml/pods/nb-0/devices")
    assert req.body == {"devices": ["0"], "force": False, **sent}


def test_the_gpumount_spec_through_the_api_server(nvcli: Nvcli, cluster: Cluster) -> None:
    config = cluster.kubeconfig("config", namespace="ml", token="alice-token")
    run = nvcli(*MOUNT, "--container", "main", "--container", "side", "--share-with", "other",
                env={"KUBECONFIG": str(config)})  # fmt: skip
    assert run.rc == 0, run.err
    (req,) = cluster.agent.received
    assert req.path == "/apis/hotmount.io/v1alpha1/namespaces/ml/gpumounts"
    assert req.body["spec"] == {
        "devices": ["0"],
        "containers": ["main", "side"],
        "shareWith": "other",
        "force": False,
    }


def test_every_container_the_agent_answered_is_shown(nvcli: Nvcli, stub: StubAgent) -> None:
    doc = nvcli(*MOUNT, "--container", "*", *agent_args(stub), "-o", "json")
    assert doc.rc == 0, doc.err
    answer = json.loads(doc.out)
    assert [(c["container"], c["containerId"]) for c in answer["containers"]] == [
        ("main", CONTAINER_ID),
        ("side", container_id("side")),
    ]
    assert all(c["mounted"][0]["uuid"] == UUID0 for c in answer["containers"])

    table = nvcli(*MOUNT, "--container", "*", *agent_args(stub))
    assert table.rc == 0, table.err
    lines = table.out.splitlines()
    assert lines[-2:] == [
        "into ml/nb-0 container main",
        f"and {UUID0} into ml/nb-0 container side",
    ]


def test_a_shared_gpu_shows_who_else_holds_it(nvcli: Nvcli, stub: StubAgent) -> None:
    mounted = nvcli(*MOUNT, "--share-with", "producer", *agent_args(stub), "-o", "json")
    assert mounted.rc == 0, mounted.err
    assert json.loads(mounted.out)["mounted"][0]["sharedWith"] == "producer"

    doc = nvcli("status", "--name", "nb-0", *agent_args(stub), "-o", "json")
    assert doc.rc == 0, doc.err
    [device] = json.loads(doc.out)["containers"][0]["devices"]
    assert device["sharedWith"] == "producer"
    assert [(h["namespace"], h["pod"]) for h in device["otherHolders"]] == [("ml", "producer")]

    table = nvcli("status", "--name", "nb-0", *agent_args(stub))
    assert table.rc == 0, table.err
    assert table_column(table.out, "SHARED WITH") == ["ml/producer (main) [hotmount]"]


def test_an_unshared_gpu_shows_no_one_else(nvcli: Nvcli, stub: StubAgent) -> None:
    table = nvcli("status", "--name", "nb-0", *agent_args(stub))
    assert table.rc == 0, table.err
    assert table_column(table.out, "SHARED WITH") == ["-"]


BAD = {
    "share-with-namespace": (["--share-with", "ns/pod"], "--share-with 'ns/pod' is not a pod"),
    "share-with-upper": (["--share-with", "Producer"], "--share-with 'Producer' is not a pod"),
    "container-invalid": (["--container", "Bad_Name"], "--container 'Bad_Name' is not a"),
    "container-second-invalid": (
        ["--container", "main", "--container", "side!"],
        "--container 'side!' is not a container name",
    ),
    "star-and-name": (
        ["--container", "*", "--container", "main"],
        "--container '*' means every container: give it alone",
    ),
}


@pytest.mark.parametrize(("flags", "says"), BAD.values(), ids=BAD.keys())
def test_a_bad_name_is_a_usage_error_before_any_request(
    nvcli: Nvcli, stub: StubAgent, cluster: Cluster, flags: list[str], says: str
) -> None:
    direct = nvcli(*MOUNT, *flags, *agent_args(stub))
    assert direct.rc == 2, direct.err
    assert f"Error: {says}" in direct.err and "Usage: nvcli mount" in direct.err
    assert direct.out == "" and stub.received == []

    config = cluster.kubeconfig("config", namespace="ml", token="alice-token")
    aggregated = nvcli(*MOUNT, *flags, env={"KUBECONFIG": str(config)})
    assert aggregated.rc == 2 and f"Error: {says}" in aggregated.err
    assert cluster.agent.received == []


# -- the real agent -------------------------------------------------------------------------


@pytest.mark.kernel
def test_against_the_agent_both_containers_then_a_shared_pod(
    nvcli: Nvcli, real: RealCluster
) -> None:
    main, side = two_container_pod(real, "ipc")
    consumer = real.pod("consumer")
    agent = real.agent()
    flags = ["--agent", agent.url, "--token", ALICE, "-n", "default"]
    node = f"/dev/nvidia{REAL_GPUS[0].minor}"

    both = nvcli("mount", "--name", "ipc", "--mount", "0", "--container", "*", *flags)
    assert both.rc == 0, both.err
    assert "into default/ipc container main" in both.out
    assert f"and {REAL_GPUS[0].uuid} into default/ipc container side" in both.out
    assert main.open_result(node) == side.open_result(node) == "ENXIO"

    unshared = nvcli("mount", "--name", "consumer", "--mount", "0", *flags)
    assert unshared.rc == 3 and "hot-mounted elsewhere" in unshared.err, unshared.err
    shared = nvcli("mount", "--name", "consumer", "--mount", "0", "--share-with", "ipc", *flags,
                   "-o", "json")  # fmt: skip
    assert shared.rc == 0, shared.err
    assert json.loads(shared.out)["mounted"][0]["sharedWith"] == "ipc"
    assert consumer.open_result(node) == "ENXIO"

    status = nvcli("status", "--name", "consumer", *flags)
    assert status.rc == 0, status.err
    [shared_with] = table_column(status.out, "SHARED WITH")
    assert "default/ipc (main) [hotmount]" in shared_with
    assert "default/ipc (side) [hotmount]" in shared_with
