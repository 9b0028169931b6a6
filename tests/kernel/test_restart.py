"""State survives the process that made it: the kernel and the ledger carry it."""

from __future__ import annotations

import json
from pathlib import Path

from tests.kernel.conftest import GPU0, engine_cli
from tests.support.runc import RuncContainer


def test_a_fresh_process_unmounts_what_another_mounted(
    container: RuncContainer, cdi_dir: Path, state_dir: Path
) -> None:
    mounted = engine_cli(cdi_dir, state_dir, "mount", "--container", container.id, "--device", GPU0)
    assert mounted.returncode == 0, mounted.stderr

    # The mounting process has exited: the grant must not depend on it.
    assert container.open_result("/dev/nvidia0") == "ENXIO"
    assert container.open_result("/dev/null") == "OK"

    status = engine_cli(cdi_dir, state_dir, "status", "--container", container.id)
    assert status.returncode == 0, status.stderr
    [device] = json.loads(status.stdout)["devices"]
    assert device["key"] == GPU0 and all(n["granted"] for n in device["nodes"])

    unmounted = engine_cli(cdi_dir, state_dir, "unmount", "--container", container.id)
    assert unmounted.returncode == 0, unmounted.stderr
    assert json.loads(unmounted.stdout)["unmounted"] == [GPU0]
    assert "nvidia0" not in container.ls_dev()
    container.mknod_as_runtime("/dev/nvidia0", "c", 195, 0)
    assert container.open_result("/dev/nvidia0") == "EPERM"
    assert container.open_result("/dev/null") == "OK"
