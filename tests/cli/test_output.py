"""table, json and yaml rendering of every result."""

from __future__ import annotations

import json
import threading

import pytest
import yaml

from cli.output import Waiting, idle_text, reclaim_text, render
from hotmount.wire.schemas import DeviceList, MountResult, PodDevices, ReassignResult, UnmountResult
from tests.cli.test_client import (
    UUID0,
    UUID1,
    device_list,
    mount_result,
    pod_devices,
    reassign_result,
    unmount_result,
)

RESULTS = {
    "mount": MountResult.model_validate(mount_result(holderPod="nb-0-gpu-holder-x")),
    "unmount": UnmountResult.model_validate(unmount_result(UUID1, [4242])),
    "status": PodDevices.model_validate(pod_devices()),
    "list": [
        DeviceList.model_validate(
            {
                "node": "node-a",
                "devices": [
                    {**device_list()["devices"][0]},
                    {
                        "key": UUID1,
                        "kind": "gpu",
                        "index": 1,
                        "uuid": UUID1,
                        "nodes": ["/dev/nvidia1"],
                        "holder": {
                            "source": "hotmount",
                            "namespace": "ml",
                            "pod": "nb-0",
                            "container": "main",
                        },
                    },
                ],
            }
        )
    ],
    "move": ReassignResult.model_validate(reassign_result(force=True)),
}


@pytest.mark.parametrize("kind", RESULTS)
def test_json_and_yaml_are_the_wire_documents(kind: str) -> None:
    result = RESULTS[kind]
    wire = (
        [r.model_dump(mode="json", by_alias=True) for r in result]
        if isinstance(result, list)
        else result.model_dump(mode="json", by_alias=True)
    )
    assert json.loads(render(result, "json")) == wire
    assert yaml.safe_load(render(result, "yaml")) == wire


def test_tables() -> None:
    mount = render(RESULTS["mount"], "table").splitlines()
    assert mount[0].split() == ["INDEX", "DEVICE", "STATE", "PATHS", "PIN"]
    assert mount[1].split() == ["0", UUID0, "mounted", "/dev/nvidia0,/dev/nvidiactl", "-"]
    assert "into ml/nb-0 container main" in mount
    assert "accounted by holder pod ml/nb-0-gpu-holder-x" in mount

    unmount = render(RESULTS["unmount"], "table").splitlines()
    assert unmount[1].split() == [UUID1, "unmounted"]
    assert "stopped PIDs: 4242" in unmount

    status = render(RESULTS["status"], "table").splitlines()
    assert status[0].split() == [
        "POD", "CONTAINER", "INDEX", "DEVICE", "UUID", "PATHS", "SHARED", "WITH", "PIN",
        "IDLE/TIMEOUT", "STATE",
    ]  # fmt: skip
    assert status[1].split()[:3] == ["ml/nb-0", "main", "1"]
    assert status[1].split()[-2:] == ["-/never", "mounted"]
    assert idle_text(0, "30m") == "busy/30m" and idle_text(720, "30m") == "12m/30m"

    warned = pod_devices()
    device = warned["containers"][0]["devices"][0]
    device.update(idleTimeout="30m", idleSeconds=1561, idlePolicy="unused")
    device.update(reclaimInSeconds=239, idlePolicyNote=None)
    warned_rows = render(PodDevices.model_validate(warned), "table").splitlines()
    assert warned_rows[1].split()[-2] == "26m1s/30m"
    assert warned_rows[-1] == "GPU 1 in main: reclaimed in 4m unless used"
    device.update(idlePolicy="suspend")  # the GPU goes, the kernel stays
    suspending = render(PodDevices.model_validate(warned), "table").splitlines()
    assert suspending[-1] == "GPU 1 in main: suspended in 4m unless used"
    device.update(state="suspended", reclaimInSeconds=None, paths=[], idlePolicy=None)
    suspended = render(PodDevices.model_validate(warned), "table").splitlines()
    assert suspended[1].split()[-1] == "suspended" and len(suspended) == 2
    device.update(idlePolicy="unused", state="mounted", reclaimInSeconds=239)
    device.update(reclaimInSeconds=None, idlePolicyNote="judged by holders (unheld): MIG")
    noted = render(PodDevices.model_validate(warned), "table").splitlines()
    assert noted[-1] == "GPU 1 in main: judged by holders (unheld): MIG"
    assert reclaim_text(45) == "reclaimed in 45s unless used"
    assert reclaim_text(0) == "reclaimed now unless used"
    assert reclaim_text(0, "suspend") == "suspended now unless used"
    assert reclaim_text(61, "unused") == "reclaimed in 2m unless used"

    listing = render(RESULTS["list"], "table").splitlines()
    assert listing[0].split() == [
        "NODE", "INDEX", "DEVICE", "KIND", "UUID", "ALIASES", "NEAREST", "BOOKS", "HELD", "BY"
    ]  # fmt: skip
    assert listing[1].endswith("<free>")
    assert listing[2].endswith("ml/nb-0 (main) [hotmount]")

    move = render(RESULTS["move"], "table").splitlines()
    assert move[1].split() == [UUID0, "a/p", "b/q"]
    assert "stopped PIDs: 4242" in move


def test_empty_results_say_so() -> None:
    empty = PodDevices(namespace="ml", pod="nb-0", containers=[])
    assert render(empty, "table") == "No devices are hot-mounted in ml/nb-0."
    assert render([DeviceList(node="n", devices=[])], "table") == "No devices found."


class _Tty:
    """A stream that says whether it is a TTY; `written` is set by its first write."""

    def __init__(self, tty: bool) -> None:
        self.tty, self.text = tty, ""
        self.written = threading.Event()

    def isatty(self) -> bool:
        return self.tty

    def write(self, text: str) -> None:
        self.text += text
        self.written.set()

    def flush(self) -> None:
        pass


def test_waiting_spins_only_on_a_tty() -> None:
    tty, pipe = _Tty(True), _Tty(False)
    with Waiting("waiting for a holder pod", stream=tty, delay=0) as spinning:  # type: ignore[arg-type]
        assert spinning.active
        assert tty.written.wait(10), "no frame was drawn on a TTY"
    with Waiting("waiting for a holder pod", stream=pipe, delay=0) as silent:  # type: ignore[arg-type]
        assert not silent.active  # no spinner at all, so nothing can be written later
    assert "waiting for a holder pod" in tty.text and tty.text.endswith("\r\033[K")
    assert pipe.text == ""
