"""`python -m hotmount` against a fixture host tree: output, exit codes and one-line errors.

Exit status: 0 done; 1 error; 2 bad input; 3 busy or conflict; 4 not found.
Nothing here gets as far as a container: every case fails before, or on a container
that does not exist.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.unit.hosttree import BY_INDEX, MIG_KEY, build_host

REPO = Path(__file__).resolve().parents[2]
CID = "c0ffee" + "0" * 58


@pytest.fixture
def host(tmp_path: Path) -> Path:
    return build_host(tmp_path / "host")


def hotmount(host: Path, *args: str) -> subprocess.CompletedProcess[str]:
    command, *rest = args
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [
            sys.executable, "-m", "hotmount", command,
            "--host-root", str(host), "--cdi-dir", "/etc/cdi",
            "--state-dir", str(host.parent / "state"), "--no-nvml", *rest,
        ],
        capture_output=True, text=True, timeout=60, cwd=REPO, env=env, check=False,
    )  # fmt: skip


def test_devices_json_lists_the_fixture_gpus(host: Path) -> None:
    result = hotmount(host, "devices", "-o", "json")
    assert result.returncode == 0, result.stderr
    devices = json.loads(result.stdout)
    gpus = [
        (d["index"], d["minor"], d["uuid"], d["pciBusId"]) for d in devices if d["kind"] == "gpu"
    ]
    assert gpus == [(i, BY_INDEX[i].minor, BY_INDEX[i].uuid, BY_INDEX[i].bus_id) for i in range(3)]
    assert [d["key"] for d in devices if d["kind"] == "mig"] == [MIG_KEY]
    assert all(d["heldBy"] is None for d in devices)
    assert devices[0]["nodes"] == [
        {"path": "/dev/nvidia5", "major": 195, "minor": 5, "fileMode": "0666", "permissions": "rw"}
    ]


def test_devices_text_has_a_row_per_device(host: Path) -> None:
    result = hotmount(host, "devices")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("INDEX")
    assert len(lines) == 1 + 4  # three GPUs and one MIG instance
    assert lines[1].split()[:2] == ["0", BY_INDEX[0].uuid]


def test_devices_includes_cdi_specs(host: Path) -> None:
    spec = host / "etc" / "cdi" / "tun.json"
    spec.parent.mkdir(parents=True)
    spec.write_text(
        json.dumps(
            {
                "cdiVersion": "0.5.0",
                "kind": "vendor.com/net",
                "devices": [
                    {
                        "name": "tun",
                        "containerEdits": {
                            "deviceNodes": [
                                {"path": "/dev/net/tun", "type": "c", "major": 10, "minor": 200}
                            ]
                        },
                    }
                ],
            }
        )
    )
    result = hotmount(host, "devices", "-o", "json")
    assert result.returncode == 0, result.stderr
    assert "vendor.com/net=tun" in [d["key"] for d in json.loads(result.stdout)]


@pytest.mark.parametrize(
    ("args", "code", "says"),
    [
        (["--container", "nothex", "--device", "0"], 2, "is not a container ID"),
        (["--container", "pid:0", "--device", "0"], 2, "a PID is a positive number"),
        (["--container", CID, "--device", "195:0"], 2, "raw major:minor"),
        (["--container", CID, "--device", "c 195:0 rwm"], 2, "raw major:minor"),
        (["--container", CID, "--device", "/dev/sda"], 2, "is a path"),
        (["--container", CID, "--device", "0,195:0"], 2, "raw major:minor"),
        (["--container", CID, "--device", ","], 2, "no device named"),
        (["--container", CID, "--device", "7"], 4, "not in this node's inventory"),
        (["--container", CID, "--device", "GPU-0000-nope"], 4, "not in this node's inventory"),
        (["--container", CID, "--device", "0"], 4, "not running"),
        (["--container", f"containerd://{CID}", "--device", "1,2"], 4, "not running"),
    ],
    ids=["container-not-hex", "pid-zero", "raw-device", "raw-v1-line", "device-path",
         "one-raw-among-good", "empty-device-list", "unknown-index", "unknown-uuid",
         "container-not-running", "prefixed-container-not-running"],
)  # fmt: skip
def test_mount_errors(host: Path, args: list[str], code: int, says: str) -> None:
    result = hotmount(host, "mount", *args)
    assert result.returncode == code, result.stderr
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ")
    assert says in lines[0]


@pytest.mark.parametrize(
    "args",
    [["--container", CID], ["--device", "0"], []],
    ids=["missing-device", "missing-container", "missing-both"],
)
def test_mount_without_required_arguments_is_a_usage_error(host: Path, args: list[str]) -> None:
    result = hotmount(host, "mount", *args)
    assert result.returncode == 2
    assert "required" in result.stderr
    assert result.stdout == ""


def test_bad_input_touches_no_state(host: Path) -> None:
    hotmount(host, "mount", "--container", "nothex", "--device", "0")
    hotmount(host, "mount", "--container", CID, "--device", "0")
    state = host.parent / "state"
    assert list((state / "containers").iterdir()) == []
    assert list((state / "claims").iterdir()) == []


def test_without_a_cgroup_hierarchy_the_engine_refuses_with_exit_1(host: Path) -> None:
    (host / "sys" / "fs" / "cgroup" / "cgroup.controllers").unlink()
    result = hotmount(host, "devices")
    assert result.returncode == 1
    assert result.stderr.startswith("error: no cgroup v2 hierarchy")
