"""Reconcile repairs what others undid: foreign v2 programs, rewritten v1 lists, lost nodes."""

from __future__ import annotations

import pytest

from hotmount.cgroups import prologue
from hotmount.engine.core import Engine
from tests.kernel.conftest import GPU0, NIC0
from tests.support.bpf import attach_foreign, attached
from tests.support.runc import RuncContainer


@pytest.mark.parametrize("replace_ours", [False, True], ids=["beside-ours", "instead-of-ours"])
def test_v2_foreign_program_is_wrapped_again(
    engine: Engine, make_container, replace_ours: bool
) -> None:
    container: RuncContainer = make_container("v2")
    [runtime_program] = attached(container.v2_dir)
    engine.mount(container.id, [GPU0])
    attach_foreign(container.v2_dir, runtime_program.xlated, replace_ours=replace_ours)
    assert container.open_result("/dev/nvidia0") == "EPERM", "the drift must take access away"

    report = engine.reconcile()

    assert report.rewrapped == 1
    assert container.open_result("/dev/nvidia0") == "ENXIO"
    assert container.open_result("/dev/null") == "OK"
    names = [p.name for p in attached(container.v2_dir)]
    assert names and all(name == prologue.WRAPPER_NAME for name in names)
    assert engine.reconcile().repairs == 0, "a second pass finds nothing to do"


def test_v1_list_rewritten_by_deny_all_is_restored(engine: Engine, make_container) -> None:
    container: RuncContainer = make_container("v1")
    engine.mount(container.id, [GPU0])
    devices = container.v1_devices_dir
    runtime_rules = [
        line
        for line in (devices / "devices.list").read_text().splitlines()
        if not line.startswith("c 195:")
    ]
    # What systemd does on daemon-reload: deny everything, then its own allows.
    (devices / "devices.deny").write_text("a")
    for rule in runtime_rules:
        (devices / "devices.allow").write_text(rule)
    assert container.open_result("/dev/nvidia0") == "EPERM"

    report = engine.reconcile()

    assert report.regranted == 2  # the GPU and nvidiactl
    assert container.open_result("/dev/nvidia0") == "ENXIO"
    assert container.open_result("/dev/null") == "OK"


def test_missing_node_is_recreated(engine: Engine, container: RuncContainer) -> None:
    engine.mount(container.id, [GPU0])
    container.exec("rm", "/dev/nvidia0")
    assert "nvidia0" not in container.ls_dev()

    report = engine.reconcile()

    assert report.recreated == 1
    assert container.open_result("/dev/nvidia0") == "ENXIO"


def test_a_node_directory_swapped_for_a_symlink_is_reported_and_the_rest_repaired(
    subdir_engine: Engine, container: RuncContainer
) -> None:
    """Issue 40: the tenant removed a node and replaced its directory with a symlink.
    The pass names the container, follows nothing, and still repairs the other node;
    the container's status reads the refused node as `mismatch`."""
    engine = subdir_engine
    engine.mount(container.id, [GPU0, NIC0])
    elsewhere = f"/tmp/elsewhere-{container.id[:12]}"  # the rootfs is shared by the session
    swapped = container.exec(
        "sh", "-c",
        f"rm /dev/nvidia0 && rm -rf /dev/infiniband && mkdir {elsewhere} && "
        f"ln -s {elsewhere} /dev/infiniband",
    )  # fmt: skip
    assert swapped.returncode == 0, swapped.stderr

    report = engine.reconcile()

    assert "/dev/infiniband" in report.errors[container.id], report.errors
    assert report.recreated == 1
    assert container.open_result("/dev/nvidia0") == "ENXIO"
    assert container.exec("ls", "-A", elsewhere).stdout == ""
    assert engine.ledger.load(container.id).nodes["/dev/nvidia0"].created
    # Its status still answers (one tenant cannot fail every status): something else is there.
    states = {n.path: n.state for d in engine.status(container.id).devices for n in d.nodes}
    assert states["/dev/infiniband/uverbs0"] == "mismatch"
    assert states["/dev/nvidia0"] == "present"


def test_gone_containers_are_forgotten(engine: Engine, make_container) -> None:
    container: RuncContainer = make_container("v1")
    engine.mount(container.id, [GPU0])
    container.stop()

    report = engine.reconcile()

    assert report.forgotten == [container.id]
    assert engine.ledger.records() == [] and engine.ledger.claims() == []
