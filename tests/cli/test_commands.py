"""nvcli as a process against an agent over HTTP: every command, format and exit code.

Two ways in: `--agent URL --token ...` (the agent's /v1 paths), and a kubeconfig
through the fake API server's aggregated front proxy (the default path).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from tests.cli.conftest import AGENT_TOKEN, Cluster, Run
from tests.cli.stub_agent import CONTAINER_ID, GPUS, StubAgent

UUID0, UUID1 = GPUS[0]["uuid"], GPUS[1]["uuid"]
Nvcli = Callable[..., Run]

COMMANDS = {
    "mount": ["mount", "--name", "nb-0", "--mount", "0"],
    "unmount": ["unmount", "--name", "nb-0", "--unmount", "1"],
    "status": ["status", "--name", "nb-0"],
    "list": ["list"],
    "move": ["move", "--gpu", "0", "--from", "nb-0", "--to", "nb-1"],
    "version": ["version"],
}


def agent_args(stub: StubAgent) -> list[str]:
    return ["--agent", stub.url, "--token", AGENT_TOKEN, "-n", "ml"]


def check_document(command: str, doc: object) -> None:
    """The json/yaml document is the wire model of the command's result."""
    assert isinstance(doc, dict | list)
    if command == "mount":
        assert doc["mounted"][0]["uuid"] == UUID0 and doc["containerId"] == CONTAINER_ID
    elif command == "unmount":
        assert doc["unmounted"] == [UUID1]
    elif command == "status":
        assert doc["containers"][0]["devices"][0]["key"] == UUID1
    elif command == "list":
        assert doc[0]["node"] == "node-a" and len(doc[0]["devices"]) == 2
    elif command == "move":
        assert doc["device"] == UUID0 and doc["to"]["pod"] == "nb-1"
    else:
        assert doc["clientVersion"]["version"]


@pytest.mark.parametrize("fmt", ["table", "json", "yaml"])
@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_and_format_direct_to_the_agent(
    nvcli: Nvcli, stub: StubAgent, command: str, fmt: str
) -> None:
    run = nvcli(*COMMANDS[command], *agent_args(stub), "-o", fmt)
    assert run.rc == 0, run.err
    if fmt == "json":
        check_document(command, json.loads(run.out))
    elif fmt == "yaml":
        check_document(command, yaml.safe_load(run.out))
    elif command == "version":
        assert run.out.startswith("nvcli ")
    else:
        assert run.out.splitlines()[0].split()[0] in ("INDEX", "DEVICE", "POD", "NODE")


@pytest.mark.parametrize("fmt", ["table", "json", "yaml"])
@pytest.mark.parametrize("command", [c for c in COMMANDS if c != "version"])
def test_every_command_through_the_api_server(
    nvcli: Nvcli, cluster: Cluster, command: str, fmt: str
) -> None:
    dave = cluster.ca.issue_client("dave", groups=["ml-team"])
    config = cluster.kubeconfig("config", namespace="ml", cert=dave)
    run = nvcli(*COMMANDS[command], "-o", fmt, env={"KUBECONFIG": str(config)})
    assert run.rc == 0, run.err
    if fmt != "table":
        check_document(command, yaml.safe_load(run.out))  # JSON is YAML too
    (req,) = cluster.agent.received
    assert req.path.startswith("/apis/hotmount.io/v1alpha1/")
    assert req.header("x-remote-user") == "dave" and req.peer_cn == "front-proxy-client"


def test_kubeconfig_flag_context_and_namespace_default(nvcli: Nvcli, cluster: Cluster) -> None:
    config = cluster.kubeconfig("config", namespace="ml", token="alice-token")
    run = nvcli("status", "--name", "nb-0", "--kubeconfig", str(config), "--context", "fake")
    assert run.rc == 0, run.err
    assert cluster.agent.received[-1].path.endswith("/namespaces/ml/gpumounts/nb-0")
    run = nvcli("status", "--name", "nb-0", "--kubeconfig", str(config), "--context", "nope")
    assert run.rc == 1 and "context 'nope' not found" in run.err


def test_flags_before_the_command_too(nvcli: Nvcli, stub: StubAgent) -> None:
    run = nvcli("-n", "team-a", "--agent", stub.url, "--token", AGENT_TOKEN, "status",
                "--name", "nb-0", "-o", "json")  # fmt: skip
    assert run.rc == 0, run.err
    assert stub.received[-1].path == "/v1/namespaces/team-a/pods/nb-0/devices"


def test_status_says_when_a_warned_gpu_is_reclaimed(nvcli: Nvcli, stub: StubAgent) -> None:
    stub.warned[("ml", "nb-0")] = 240
    run = nvcli("status", "--name", "nb-0", *agent_args(stub))
    assert run.rc == 0, run.err
    assert run.out.splitlines()[-1] == "GPU 1 in main: reclaimed in 4m unless used"
    run = nvcli("status", "--name", "nb-0", "-o", "json", *agent_args(stub))
    [device] = json.loads(run.out)["containers"][0]["devices"]
    assert device["reclaimInSeconds"] == 240 and device["idlePolicy"] == "unused"


def test_status_under_the_policy_suspend_says_suspended(nvcli: Nvcli, stub: StubAgent) -> None:
    stub.warned[("ml", "nb-0")] = 240
    stub.device_fields[("ml", "nb-0")] = {"idlePolicy": "suspend"}
    run = nvcli("status", "--name", "nb-0", *agent_args(stub))
    assert run.rc == 0, run.err
    assert run.out.splitlines()[-1] == "GPU 1 in main: suspended in 4m unless used"
    assert run.out.splitlines()[1].split()[-1] == "mounted"
    del stub.warned[("ml", "nb-0")]
    stub.device_fields[("ml", "nb-0")] = {"state": "suspended", "paths": []}
    run = nvcli("status", "--name", "nb-0", *agent_args(stub))
    assert run.rc == 0, run.err
    assert run.out.splitlines()[0].split()[-1] == "STATE"
    assert run.out.splitlines()[1].split()[-1] == "suspended" and len(run.out.splitlines()) == 2


# -- parsing: as operators type it --------------------------------------------------------------


@pytest.mark.parametrize(
    "flags",
    [["--mount=0"], ["--mount", "0"], ["--mount", "0,1"], ["--mount=0,1"],
     ["--mount", "0", "--mount", "1"], ["--mount", f"{UUID0},nvidia.com/gpu=1"]],
    ids=["equals", "space", "comma", "equals-comma", "repeated", "uuid-and-cdi"],
)  # fmt: skip
def test_mount_device_flags(nvcli: Nvcli, stub: StubAgent, flags: list[str]) -> None:
    run = nvcli("mount", "--name", "nb-0", *flags, *agent_args(stub))
    assert run.rc == 0, run.err
    expected = [part for flag in flags if flag != "--mount" for part in
                flag.removeprefix("--mount=").split(",")]  # fmt: skip
    assert stub.received[-1].body == {"devices": expected, "force": False}


def test_mount_by_count_container_and_force(nvcli: Nvcli, stub: StubAgent) -> None:
    run = nvcli("mount", "--name", "nb-0", "--count", "2", "--container", "main", "--force",
                *agent_args(stub))  # fmt: skip
    assert run.rc == 0, run.err
    assert stub.received[-1].body == {"container": "main", "count": 2, "force": True}
    assert "accounted by holder pod ml/nb-0-gpu-holder-x1y2z" in run.out


def test_unmount_flags(nvcli: Nvcli, stub: StubAgent) -> None:
    run = nvcli("unmount", "--name", "nb-0", "--unmount=0,1", "--force", "--container", "main",
                *agent_args(stub))  # fmt: skip
    assert run.rc == 0, run.err
    deletes = [(r.method, r.path, r.query) for r in stub.received]
    query = {"force": ["true"], "container": ["main"]}
    assert deletes == [
        ("DELETE", "/v1/namespaces/ml/pods/nb-0/devices/0", query),
        ("DELETE", "/v1/namespaces/ml/pods/nb-0/devices/1", query),
    ]
    assert "stopped PIDs: 4242" in run.out
    run = nvcli("unmount", "--name", "nb-0", "--all", *agent_args(stub), "-o", "json")
    assert run.rc == 0 and json.loads(run.out)["unmounted"] == [UUID1]


def test_move_namespaces(nvcli: Nvcli, stub: StubAgent) -> None:
    run = nvcli("move", "--gpu", "0", "--from", "a", "--from-namespace", "team-a", "--to", "b",
                "--to-namespace", "team-b", "--force", *agent_args(stub))  # fmt: skip
    assert run.rc == 0, run.err
    assert stub.received[-1].body == {
        "device": "0",
        "from": {"namespace": "team-a", "pod": "a"},
        "to": {"namespace": "team-b", "pod": "b"},
        "force": True,
    }


def test_list_node(nvcli: Nvcli, stub: StubAgent, cluster: Cluster) -> None:
    assert nvcli("list", "--node", "node-a", *agent_args(stub)).rc == 0
    missing = nvcli("list", "--node", "node-z", *agent_args(stub))
    assert missing.rc == 4 and "serves node 'node-a'" in missing.err
    config = cluster.kubeconfig("config", token="alice-token")
    run = nvcli("list", "--node", "node-a", "--kubeconfig", str(config), "-o", "json")
    assert run.rc == 0, run.err
    assert cluster.agent.received[-1].path.endswith("/nodedevices/node-a")


def test_standalone_agent_by_container_id(nvcli: Nvcli, stub: StubAgent) -> None:
    run = nvcli("mount", "--container", CONTAINER_ID, "--mount", "0", "--agent", stub.url,
                "--token", AGENT_TOKEN)  # fmt: skip
    assert run.rc == 0, run.err
    assert stub.received[-1].path == f"/v1/containers/{CONTAINER_ID}/devices"


def test_token_file_and_verbose_logging(nvcli: Nvcli, stub: StubAgent, tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text(AGENT_TOKEN + "\n")
    run = nvcli("list", "--agent", stub.url, "--token-file", str(token), "--v", "6")
    assert run.rc == 0, run.err
    assert f"GET {stub.url}/v1/devices 200 OK in" in run.err
    assert "<masked>" in run.err and AGENT_TOKEN not in run.err
    quiet = nvcli("list", "--agent", stub.url, "--token-file", str(token))
    assert quiet.err == ""


# -- exit codes ------------------------------------------------------------------------------

HOLDERS = {"holders": [{"pid": 4242, "command": "python", "path": "/dev/nvidia0"}]}


@pytest.mark.parametrize(
    ("code", "reason", "details", "exit_code", "says"),
    [
        (409, "DeviceBusy", {**HOLDERS, "container": "main"}, 3,
         "GPU 0 is in use by PID 4242 (python) in container main; "
         "retry with --force to stop it"),
        (409, "DeviceClaimed", None, 3, "unmount it there first"),
        (409, "PodNotRunning", None, 3, "wait until the pod is Running"),
        (404, "PodNotFound", None, 4, "check the pod name and the namespace (-n)"),
        (404, "DeviceNotFound", None, 4, "nvcli list shows the node's devices"),
        (400, "InvalidDevice", None, 2, "name a device by index, UUID or CDI name"),
        (403, "Forbidden", None, 5, "ask for delete on gpumounts.hotmount.io in namespace"),
        (504, "Timeout", None, 6, "raise --timeout"),
        (503, "NotReady", None, 1, "retry shortly"),
    ],
    ids=lambda v: v if isinstance(v, str) and v[0].isupper() else None,
)  # fmt: skip
def test_agent_errors_become_exit_codes_and_advice(
    nvcli: Nvcli,
    stub: StubAgent,
    code: int,
    reason: str,
    details: dict | None,
    exit_code: int,
    says: str,
) -> None:
    stub.fail(code, reason, f"agent says {reason}", details)
    run = nvcli("unmount", "--name", "nb-0", "--unmount", "0", *agent_args(stub))
    assert run.rc == exit_code, run.err
    assert run.out == ""
    assert run.err.startswith("error: ") and says in run.err


def test_exit_0_success(nvcli: Nvcli, stub: StubAgent) -> None:
    assert nvcli("status", "--name", "nb-0", *agent_args(stub)).rc == 0


def test_exit_1_agent_unreachable(nvcli: Nvcli) -> None:
    run = nvcli("list", "--agent", "http://127.0.0.1:9", "--token", "x")
    assert run.rc == 1 and "cannot reach the agent" in run.err


def test_a_token_never_goes_to_an_agent_over_plain_http_on_the_network(
    nvcli: Nvcli, tmp_path: Path
) -> None:
    """Refused before any connection (the address is unroutable: a try would time out)."""
    token_file = tmp_path / "token"
    token_file.write_text("s3cret\n")
    for credential in (["--token", "s3cret"], ["--token-file", str(token_file)]):
        run = nvcli("list", "--agent", "http://10.255.255.1:8443", *credential, "--timeout", "5s")
        assert run.rc == 2 and "clear text" in run.err, run.err
        assert "s3cret" not in run.err
    # Without a token nothing secret goes out: plain http stays allowed (and fails to connect).
    bare = nvcli("list", "--agent", "http://127.0.0.1:9")
    assert bare.rc == 1 and "cannot reach the agent" in bare.err


def test_exit_1_no_kubeconfig(nvcli: Nvcli) -> None:
    run = nvcli("list")
    assert run.rc == 1 and "no kubeconfig" in run.err


def test_exit_5_bad_token_and_forbidden(nvcli: Nvcli, stub: StubAgent, cluster: Cluster) -> None:
    run = nvcli("list", "--agent", stub.url, "--token", "wrong")
    assert run.rc == 5 and "--token or --token-file" in run.err
    bad = cluster.kubeconfig("bad", token="no-such-token")
    assert nvcli("list", "--kubeconfig", str(bad)).rc == 5
    alice = cluster.kubeconfig("alice", token="alice-token")
    run = nvcli("mount", "--name", "etcd", "-n", "kube-system", "--mount", "0",
                "--kubeconfig", str(alice))  # fmt: skip
    assert run.rc == 5 and 'User "alice"' in run.err
    assert cluster.agent.received == []


def test_exit_6_timeout(nvcli: Nvcli, stub: StubAgent) -> None:
    stub.delay = 2.0
    run = nvcli("mount", "--name", "nb-0", "--count", "1", *agent_args(stub), "--timeout", "300ms")
    assert run.rc == 6 and "in time" in run.err


def test_exit_4_without_the_apiservice(nvcli: Nvcli, cluster: Cluster) -> None:
    cluster.apiserver.configure_front_proxy(None)
    config = cluster.kubeconfig("admin")
    run = nvcli("list", "--kubeconfig", str(config))
    assert run.rc == 4 and "APIService v1alpha1.hotmount.io" in run.err
