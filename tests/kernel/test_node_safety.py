"""Nodes are made inside the container's root, never through its symlinks on the host."""

from __future__ import annotations

import ctypes
import dataclasses
import os
import signal
import time
from pathlib import Path

import pytest

from hotmount.devices.model import DeviceNode
from hotmount.engine.core import Engine, EngineConfig
from hotmount.errors import ContainerNotFound, UnsafePath
from hotmount.tenantfs import procfs
from hotmount.tenantfs.devnodes import NodeState, Openat2Fs, SetnsFs, open_container_fs
from tests.kernel.conftest import GPU0
from tests.support.runc import RuncContainer, make_rootfs

FS_KINDS = {"openat2": Openat2Fs, "setns": SetnsFs}


@pytest.fixture(params=sorted(FS_KINDS))
def fs_kind(request: pytest.FixtureRequest) -> str:
    return request.param


def test_symlink_to_host_root_is_refused_and_nothing_escapes(
    container: RuncContainer, fs_kind: str
) -> None:
    """`/dev/trap -> /`: through the host's /proc/PID/root the node would land in the
    host's `/`. Nothing below the container's /dev is followed through a symlink, so it
    lands nowhere: not on the host, not in the container's own `/` either."""
    marker = f"hotmount-escape-{container.id[:8]}"
    container.exec("ln", "-s", "/", "/dev/trap")
    fs = FS_KINDS[fs_kind](procfs.ProcessDir("/proc", container.pid))
    try:
        with pytest.raises(UnsafePath, match="/dev/trap"):
            fs.ensure(DeviceNode(f"/dev/trap/{marker}", 195, 0))
    finally:
        fs.close()

    assert not Path("/", marker).exists(), "a node escaped onto the host"
    assert marker not in container.exec("ls", "/").stdout


@pytest.mark.parametrize(
    "path", ["/dev/nvidia-caps/nvidia-cap1", "/dev/nvidia-caps/deeper/nvidia-cap1"]
)
def test_a_node_directory_that_is_a_symlink_is_refused_and_nothing_is_made_elsewhere(
    container: RuncContainer, fs_kind: str, path: str
) -> None:
    """Issue 40: the tenant replaces a node's directory (`rm -rf /dev/nvidia-caps;
    ln -s /tmp/elsewhere /dev/nvidia-caps`). Looking, making and removing are refused
    (UnsafePath) without following it: nothing is made there, not even a directory."""
    elsewhere = f"/tmp/elsewhere-{container.id[:12]}"  # the rootfs is shared by the session
    made = container.exec("sh", "-c", f"mkdir {elsewhere} && ln -s {elsewhere} /dev/nvidia-caps")
    assert made.returncode == 0, made.stderr
    fs = FS_KINDS[fs_kind](procfs.ProcessDir("/proc", container.pid))
    node = DeviceNode(path, 195, 1, file_mode=0o444)
    try:
        for step in (fs.state, fs.ensure, fs.remove):
            with pytest.raises(UnsafePath, match="/dev/nvidia-caps"):
                step(node)
    finally:
        fs.close()

    assert container.exec("ls", "-A", elsewhere).stdout == ""
    assert container.exec("ls", "-ld", "/dev/nvidia-caps").stdout.startswith("l")


@pytest.mark.parametrize(
    "occupant",
    [["ln", "-s", "/dev/null", "/dev/nvidia0"], ["sh", "-c", "echo hi > /dev/nvidia0"]],
    ids=["symlink", "regular-file"],
)
def test_existing_path_that_is_not_the_device_is_refused(
    engine: Engine, container: RuncContainer, occupant: list[str]
) -> None:
    container.exec(*occupant)
    before = container.exec("ls", "-l", "/dev/nvidia0").stdout

    with pytest.raises(UnsafePath):
        engine.mount(container.id, [GPU0])

    assert container.exec("ls", "-l", "/dev/nvidia0").stdout == before
    assert engine.ledger.records() == []
    if container.mode == "v1":
        assert "195:0" not in (container.v1_devices_dir / "devices.list").read_text()


def test_other_device_at_the_path_is_refused(engine: Engine, container: RuncContainer) -> None:
    container.mknod_as_runtime("/dev/nvidia0", "c", 1, 3)

    with pytest.raises(UnsafePath):
        engine.mount(container.id, [GPU0])

    assert container.open_result("/dev/nvidia0") == "OK"  # still /dev/null's 1:3, untouched


def test_setns_fallback_mounts_and_unmounts(
    container: RuncContainer, cdi_dir: Path, tmp_path: Path
) -> None:
    engine = Engine(
        EngineConfig(
            cdi_dirs=(str(cdi_dir),), state_dir=tmp_path / "s", use_nvml=False, node_method="setns"
        )
    )
    engine.mount(container.id, [GPU0])
    assert container.open_result("/dev/nvidia0") == "ENXIO"
    assert container.exec("stat", "-c", "%a", "/dev/nvidia0").stdout.strip() == "666"

    engine.unmount(container.id, [GPU0])
    assert "nvidia0" not in container.ls_dev()


def test_nodes_get_their_exact_mode_despite_the_umask(
    container: RuncContainer, fs_kind: str
) -> None:
    fs = FS_KINDS[fs_kind](procfs.ProcessDir("/proc", container.pid))
    node = DeviceNode("/dev/nvidia-caps/nvidia-cap1", 195, 1, file_mode=0o444)
    try:
        assert fs.ensure(node)
        assert fs.state(node) is NodeState.PRESENT
        assert not fs.ensure(node), "a second ensure finds it there"
    finally:
        fs.close()
    assert (
        container.exec("stat", "-c", "%a", "/dev/nvidia-caps/nvidia-cap1").stdout.strip() == "444"
    )


def test_a_reused_init_pid_is_not_taken_for_the_container(
    engine: Engine, container: RuncContainer, make_container
) -> None:
    """The init PID resolved a moment ago now names another container's process (the
    container exited and its PID was reused): nothing is granted or made anywhere."""
    other = make_container(container.mode)
    resolved = engine.resolve(container.id)
    reused = dataclasses.replace(resolved, init_pid=other.pid)

    with pytest.raises(ContainerNotFound):
        engine.mount(reused, [GPU0])

    assert "nvidia0" not in other.ls_dev() and "nvidia0" not in container.ls_dev()
    assert engine.ledger.records() == []
    if container.mode == "v1":
        assert "195:0" not in (container.v1_devices_dir / "devices.list").read_text()


@pytest.mark.parametrize("method", sorted(FS_KINDS))
def test_a_pid_reused_by_another_container_is_refused_by_the_door_itself(
    engine: Engine, container: RuncContainer, make_container, method: str
) -> None:
    """Reconcile opens a container's /dev with no pidfd of its own held (its record's
    init resolved a moment before): the PID reused meanwhile by another container's
    process must not hand the door that container's root. Pinned by the cgroups the
    container was resolved in, nothing is opened, and nothing made there."""
    other = make_container(container.mode)
    resolved = engine.resolve(container.id)
    reused = dataclasses.replace(resolved, init_pid=other.pid)
    node = DeviceNode("/dev/nvidia0", 195, 0)

    with pytest.raises(ContainerNotFound):
        fs = open_container_fs(engine.host.proc, reused, method)
        try:
            fs.ensure(node)
        finally:
            fs.close()

    assert "nvidia0" not in other.ls_dev()


def test_a_dev_that_is_itself_a_symlink_is_refused_not_followed(tmp_path: Path) -> None:
    """/dev itself was opened through a symlink (only the steps below it were not): a
    root whose /dev is a link (a privileged tenant that unmounted the runtime's /dev, a
    runtime that mounts none) led node work, in the agent's own process, wherever it
    points, a hung volume included. Here it points to a plain directory of the same
    filesystem, so the walk comes back: it must be refused, and nothing made there."""
    root = tmp_path / "root"
    (root / "elsewhere").mkdir(parents=True)
    (root / "dev").symlink_to("/elsewhere")
    ready_read, ready_write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the tenant: a process whose / is `root`
        try:
            os.chroot(root)
            os.write(ready_write, b"x")
            time.sleep(60)
        finally:
            os._exit(0)
    os.close(ready_write)
    try:
        assert os.read(ready_read, 1) == b"x"
        fs = Openat2Fs(procfs.ProcessDir("/proc", pid))
        try:
            with pytest.raises(UnsafePath, match="/dev in the container is a symlink"):
                fs.ensure(DeviceNode("/dev/nvidia0", 195, 0))
        finally:
            fs.close()
        assert list((root / "elsewhere").iterdir()) == []
    finally:
        os.close(ready_read)
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)


def _replace_dev_with_a_symlink(pid: int) -> None:
    """What a privileged tenant can do: unmount the runtime's /dev and put a symlink in
    its place (done here from a child in the container's mount namespace)."""
    child = os.fork()
    if child == 0:  # pragma: no cover - runs in the child
        code = 1
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            with open(f"/proc/{pid}/ns/mnt") as ns:
                assert libc.setns(ns.fileno(), 0x00020000) == 0  # CLONE_NEWNS
            assert libc.umount2(b"/dev", 2) == 0  # MNT_DETACH
            os.rmdir("/dev")
            os.mkdir("/elsewhere")
            os.symlink("/elsewhere", "/dev")
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 0


@pytest.mark.parametrize("method", sorted(FS_KINDS))
def test_a_containers_dev_replaced_by_a_symlink_is_refused_not_followed(
    engine: Engine, tmp_path: Path, method: str
) -> None:
    """The same in a real container, for both ways of making nodes: the setns child
    opened /dev as the namespace resolves it, through the symlink."""
    container = RuncContainer(tmp_path, make_rootfs(tmp_path / "private"), "v2")
    try:
        _replace_dev_with_a_symlink(container.pid)
        resolved = engine.resolve(container.id)
        fs = open_container_fs(engine.host.proc, resolved, method)
        try:
            with pytest.raises(UnsafePath, match="/dev in the container is"):
                fs.ensure(DeviceNode("/dev/nvidia0", 195, 0))
        finally:
            fs.close()
        assert container.exec("ls", "/elsewhere").stdout.split() == []
    finally:
        container.stop()
