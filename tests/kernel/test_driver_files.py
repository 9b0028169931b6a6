"""The driver's files come with the device into a running container with no NVIDIA
files (issue 19): real runc containers, cgroup v1 and v2, a stand-in driver
(tests/fakes/driver), through a CDI spec with mounts and hooks and through a driver
root. The stand-in nvidia-smi runs after the mount and is gone after the unmount;
the attacks (symlinked target directories, a different file at a target,
ld.so.conf.d pointing at the host, a read-only root) change nothing outside."""

from __future__ import annotations

import json
import os
import shutil
import socket
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from hotmount.engine.core import Engine, EngineConfig
from hotmount.errors import ContainerNotFound, DriverRefused, DriverUnavailable, UnsafePath
from hotmount.host import liveness
from hotmount.state.ledger import PendingOp
from tests.fakes import driver as stand_in
from tests.fakes import nvml
from tests.kernel.conftest import STAND_IN_SPEC, engine_cli
from tests.support.pids import pid_exists, spawn_with_pid
from tests.support.runc import RuncContainer, make_rootfs
from tests.support.waiting import wait_for

pytestmark = pytest.mark.skipif(nvml.gcc() is None, reason="gcc builds the stand-in driver")

GPU = "nvidia.com/gpu=0"
UUID = "GPU-5ca1ab1e-0000-4000-8000-000000000001"
SMI = "FAKE_NVML_CONFIG=/etc/fake-gpus.conf exec nvidia-smi"
LIB = stand_in.LIB_DIR


@pytest.fixture(scope="module")
def driver_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return stand_in.build_root(tmp_path_factory.mktemp("driver"))


def _rootfs(base: Path) -> Path:
    """A busybox rootfs with a glibc of its own and no NVIDIA file: a plain image."""
    rootfs = make_rootfs(base)
    stand_in.add_glibc(rootfs)
    (rootfs / "etc").mkdir()
    nvml.write_config(rootfs / "etc/fake-gpus.conf", [nvml.FakeGpu(UUID, "0000:3b:00.0", 0)])
    return rootfs


def _cdi_spec(driver_root: Path, hook_marker: Path) -> str:
    options = "[ro, nosuid, nodev, bind]"
    version = stand_in.VERSION
    mounts = "".join(
        f"    - {{hostPath: {driver_root}{path}, containerPath: {path}, options: {options}}}\n"
        for path in (
            f"{LIB}/libnvidia-ml.so.{version}",
            f"{LIB}/libcuda.so.{version}",
            "/usr/bin/nvidia-smi",
        )
    )
    hook = hook_marker.parent / "nvidia-cdi-hook"
    return f"""\
cdiVersion: 0.6.0
kind: nvidia.com/gpu
devices:
  - name: "0"
    containerEdits:
      deviceNodes:
        - {{path: /dev/nvidia0, type: c, major: 195, minor: 0}}
containerEdits:
  env: [NVIDIA_VISIBLE_DEVICES=void]
  mounts:
{mounts}  hooks:
    - hookName: createContainer
      path: {hook}
      args: [nvidia-cdi-hook, create-symlinks, --link, libcuda.so.1::{LIB}/libcuda.so]
    - hookName: createContainer
      path: {hook}
      args: [nvidia-cdi-hook, update-ldcache, --folder, {LIB}]
    - hookName: createContainer
      path: {hook}
      args: [nvidia-cdi-hook, enable-cuda-compat, --host-driver-version={version}]
"""


@pytest.fixture
def hook_marker(tmp_path: Path) -> Path:
    """A hook program that would leave a marker if anything ran it."""
    marker = tmp_path / "hooks" / "ran"
    marker.parent.mkdir()
    hook = marker.parent / "nvidia-cdi-hook"
    hook.write_text(f"#!/bin/sh\ntouch {marker}\n")
    hook.chmod(0o755)
    return marker


@pytest.fixture(params=["cdi", "driver-root"])
def source(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
def engine(tmp_path: Path, driver_root: Path, hook_marker: Path, source: str) -> Engine:
    cdi = tmp_path / "cdi"
    cdi.mkdir()
    if source == "cdi":
        (cdi / "nvidia.yaml").write_text(_cdi_spec(driver_root, hook_marker))
        root = None
    else:
        (cdi / "nvidia.yaml").write_text(_cdi_spec(driver_root, hook_marker).split("  env:")[0])
        root = str(driver_root)
    config = EngineConfig(
        cdi_dirs=(str(cdi),), state_dir=tmp_path / "state", use_nvml=False, driver_root=root
    )
    return Engine(config)


@pytest.fixture
def run_container(tmp_path: Path, mode: str) -> Iterator:
    made: list[RuncContainer] = []

    def start(rootfs: Path, readonly: bool = False) -> RuncContainer:
        made.append(RuncContainer(tmp_path, rootfs, mode, readonly_root=readonly))
        return made[-1]

    yield start
    for container in made:
        container.stop()


def _smi(container: RuncContainer) -> tuple[int, str]:
    result = container.exec("sh", "-c", SMI)
    return result.returncode, result.stdout + result.stderr


def test_stand_in_nvidia_smi_runs_after_the_mount_and_is_gone_after_the_unmount(
    engine: Engine, run_container, tmp_path: Path, hook_marker: Path, source: str
) -> None:
    rootfs = _rootfs(tmp_path / "image")
    container = run_container(rootfs)
    assert _smi(container)[0] != 0  # sh: nvidia-smi: not found

    result = engine.mount(container.id, [GPU], with_driver=True)

    code, out = _smi(container)
    assert code == 0, out
    assert f"GPU 0: stand-in (UUID: {UUID})" in out
    assert (
        result.driver is not None
        and f"{LIB}/libnvidia-ml.so.{stand_in.VERSION}" in result.driver["files"]
    )
    # The linker found libnvidia-ml.so.1 through a soname link in the libc directory.
    assert (
        container.exec("ls", f"/lib/{stand_in.triplet()}").stdout.split().count("libnvidia-ml.so.1")
        == 1
    )
    # Read-only, whatever the caller tries.
    wrote = container.exec("sh", "-c", f"echo x > {LIB}/libcuda.so.{stand_in.VERSION}")
    assert wrote.returncode != 0 and "Read-only" in wrote.stderr
    assert container.open_result("/dev/nvidia0") == "ENXIO"
    if source == "cdi":
        assert (
            container.exec("ls", "-l", f"{LIB}/libcuda.so").stdout.strip().endswith("libcuda.so.1")
        )
        assert result.driver["env"] == {"NVIDIA_VISIBLE_DEVICES": "void"}
        assert result.driver["ignoredHooks"] == ["enable-cuda-compat"]
    else:
        assert (
            container.exec("cat", f"/lib/firmware/nvidia/{stand_in.VERSION}/gsp.bin").stdout
            == "stand-in firmware"
        )
    assert not hook_marker.exists()  # no hook program ever ran

    gone = engine.unmount(container.id, [GPU])

    assert _smi(container)[0] != 0
    assert container.exec("ls", LIB).stdout.split() == []
    assert "libnvidia-ml.so.1" not in container.exec("ls", f"/lib/{stand_in.triplet()}").stdout
    assert f"{LIB}/libcuda.so.{stand_in.VERSION}" in gone.driver_removed
    assert engine.ledger.records() == []
    assert not (rootfs / "usr/bin/nvidia-smi").exists()


def test_a_busy_library_is_detached_lazily_and_its_user_keeps_it(
    engine: Engine, run_container, tmp_path: Path
) -> None:
    container = run_container(_rootfs(tmp_path / "image"))
    engine.mount(container.id, [GPU], with_driver=True)
    library = f"{LIB}/libnvidia-ml.so.{stand_in.VERSION}"
    holder = container.exec_in_background("sh", "-c", f"exec 3<{library}; exec sleep 100000")
    try:
        wait_for(lambda: _holds(container, library), f"the background shell to hold {library}")
        gone = engine.unmount(container.id, [GPU])
        assert library in gone.driver_detached
        assert _smi(container)[0] != 0
    finally:
        holder.kill()
        holder.wait()


def _holds(container: RuncContainer, path: str) -> bool:
    out = container.exec("sh", "-c", "ls -l /proc/*/fd 2>/dev/null").stdout
    return path in out


def test_reconcile_puts_back_a_library_someone_unmounted(
    engine: Engine, run_container, tmp_path: Path
) -> None:
    container = run_container(_rootfs(tmp_path / "image"))
    engine.mount(container.id, [GPU], with_driver=True)
    enter = ["nsenter", "-t", str(container.pid), "-m", "/bin/busybox"]
    subprocess.run([*enter, "umount", "/usr/bin/nvidia-smi"], check=True)
    subprocess.run([*enter, "rm", "/usr/bin/nvidia-smi"], check=True)
    assert _smi(container)[0] != 0

    report = engine.reconcile()

    assert report.recreated >= 1
    assert _smi(container)[0] == 0


# -- attacks
def test_symlinked_directories_and_ld_so_conf_d_stay_inside_the_container(
    engine: Engine, run_container, tmp_path: Path
) -> None:
    rootfs = _rootfs(tmp_path / "image")
    host_lib = tmp_path / "host-lib"  # what the container's symlinks name, on the host
    host_ldconf = tmp_path / "host-ld.so.conf.d"
    host_lib.mkdir()
    host_ldconf.mkdir()
    (rootfs / str(host_lib).lstrip("/")).mkdir(parents=True)  # the same path, inside
    (rootfs / LIB.lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
    (rootfs / LIB.lstrip("/")).symlink_to(host_lib)
    (rootfs / "etc/ld.so.conf.d").symlink_to(host_ldconf)
    host_bin = tmp_path / "host-bin"  # exists on the host and, by that path, in the container
    host_bin.mkdir()
    (rootfs / str(host_bin).lstrip("/")).mkdir(parents=True)
    (rootfs / "usr/bin").symlink_to("/../../.." + str(host_bin))
    container = run_container(rootfs)

    engine.mount(container.id, [GPU], with_driver=True)

    assert list(host_lib.iterdir()) == [] and list(host_ldconf.iterdir()) == []
    assert list(host_bin.iterdir()) == []
    # Resolved inside the container instead, where the files work.
    assert (rootfs / str(host_lib).lstrip("/") / f"libcuda.so.{stand_in.VERSION}").exists()
    assert _smi(container)[0] == 0
    engine.unmount(container.id, [GPU])
    assert list(host_lib.iterdir()) == []


def test_a_different_file_at_a_target_is_refused_and_nothing_changes(
    engine: Engine, run_container, tmp_path: Path
) -> None:
    rootfs = _rootfs(tmp_path / "image")
    (rootfs / "usr/bin").mkdir(parents=True)
    (rootfs / "usr/bin/nvidia-smi").write_text("#!/bin/sh\necho the image's own\n")
    container = run_container(rootfs)

    with pytest.raises(UnsafePath, match="/usr/bin/nvidia-smi"):
        engine.mount(container.id, [GPU], with_driver=True)

    assert (rootfs / "usr/bin/nvidia-smi").read_text() == "#!/bin/sh\necho the image's own\n"
    assert (
        not (rootfs / LIB.lstrip("/")).exists() or list((rootfs / LIB.lstrip("/")).iterdir()) == []
    )
    assert "nvidia0" not in container.ls_dev()
    assert engine.ledger.records() == []


def test_a_read_only_root_is_refused_cleanly(engine: Engine, run_container, tmp_path: Path) -> None:
    container = run_container(_rootfs(tmp_path / "image"), readonly=True)

    with pytest.raises(DriverRefused, match="read-only"):
        engine.mount(container.id, [GPU], with_driver=True)

    assert "nvidia0" not in container.ls_dev()
    assert engine.ledger.records() == [] and engine.ledger.claims() == []
    assert _smi(container)[0] != 0


def test_auto_injects_only_where_the_linker_finds_no_libcuda(
    engine: Engine, run_container, tmp_path: Path
) -> None:
    auto = Engine(EngineConfig(**{**engine.config.__dict__, "inject_driver": "auto"}))
    bare = run_container(_rootfs(tmp_path / "bare"))
    own = _rootfs(tmp_path / "own")
    # Its own libcuda where the linker looks but no driver file would go (/usr/lib64): only
    # auto's look, not a refused target, keeps the driver's files out.
    (own / "usr/lib64").mkdir(parents=True, exist_ok=True)
    shutil.copy(
        next((tmp_path / "bare").glob("rootfs/lib/*/libc.so.6")), own / "usr/lib64/libcuda.so.1"
    )
    has_cuda = run_container(own)

    assert auto.mount(bare.id, [GPU]).driver is not None
    assert _smi(bare)[0] == 0
    auto.unmount(bare.id)
    assert auto.mount(has_cuda.id, [GPU]).driver is None
    assert _smi(has_cuda)[0] != 0


def test_the_engine_cli_mounts_with_the_driver_from_a_driver_root(
    tmp_path: Path, driver_root: Path, run_container
) -> None:
    cdi = tmp_path / "cdi-plain"
    cdi.mkdir()
    (cdi / "gpu.yaml").write_text(STAND_IN_SPEC)
    container = run_container(_rootfs(tmp_path / "image"))
    args = ["--container", container.id, "--device", GPU]

    mounted = engine_cli(
        cdi, tmp_path / "state", "mount", *args, "--with-driver", "--driver-root", str(driver_root)
    )

    assert mounted.returncode == 0, mounted.stderr
    assert "/usr/bin/nvidia-smi" in json.loads(mounted.stdout)["driver"]["files"]
    assert _smi(container)[0] == 0
    gone = engine_cli(cdi, tmp_path / "state", "unmount", *args)
    assert gone.returncode == 0, gone.stderr
    assert _smi(container)[0] != 0


@pytest.mark.parametrize("kind", ["fifo", "char-device"])
def test_an_ld_so_cache_that_is_no_file_is_never_opened(
    engine: Engine, run_container, tmp_path: Path, kind: str
) -> None:
    """A FIFO would hang the agent's open for good (with the container's lock held); a
    device node opened by root on the host side would bypass the devices cgroup (a
    watchdog starts on open). Both are looked at, never opened, and auto goes on."""
    auto = Engine(EngineConfig(**{**engine.config.__dict__, "inject_driver": "auto"}))
    rootfs = _rootfs(tmp_path / "image")
    cache = rootfs / "etc" / "ld.so.cache"
    cache.parent.mkdir(parents=True, exist_ok=True)
    if kind == "fifo":
        os.mkfifo(cache)
    else:
        os.mknod(cache, 0o600 | stat.S_IFCHR, os.makedev(1, 3))  # /dev/null's numbers
    container = run_container(rootfs)

    result = auto.mount(container.id, [GPU])  # an open of a FIFO would never return

    assert result.driver is not None
    assert (rootfs / LIB.lstrip("/") / f"libcuda.so.{stand_in.VERSION}").exists()
    if kind != "fifo":  # the container's own loader would block on its FIFO
        assert _smi(container)[0] == 0
    auto.unmount(container.id)


def test_auto_into_a_read_only_root_mounts_the_gpu_without_the_files(
    engine: Engine, run_container, tmp_path: Path
) -> None:
    """Nobody asked for the files: a read-only root still gets its GPU."""
    auto = Engine(EngineConfig(**{**engine.config.__dict__, "inject_driver": "auto"}))
    container = run_container(_rootfs(tmp_path / "image"), readonly=True)

    result = auto.mount(container.id, [GPU])

    assert result.driver is None and [m.key for m in result.mounted]
    assert "nvidia0" in container.ls_dev()
    auto.unmount(container.id)


@pytest.fixture
def shared_driver_root(driver_root: Path) -> Iterator[Path]:
    """The driver's files on a shared mount, as under systemd's `/` (this machine's `/`
    is private, so the test makes one)."""
    subprocess.run(["mount", "--bind", str(driver_root), str(driver_root)], check=True)
    try:
        subprocess.run(["mount", "--make-shared", str(driver_root)], check=True)
        yield driver_root
    finally:
        subprocess.run(["umount", "-l", str(driver_root)], check=False)


def test_the_bound_files_are_private_mounts_never_peers_of_the_host(
    engine: Engine, run_container, tmp_path: Path, shared_driver_root: Path
) -> None:
    """A clone of a shared source would join the host's peer group: a mount the
    container makes over its copy would then reach the host's own file."""
    container = run_container(_rootfs(tmp_path / "image"))
    engine.mount(container.id, [GPU], with_driver=True)
    target = f"{LIB}/libcuda.so.{stand_in.VERSION}"
    mountinfo = Path(f"/proc/{container.pid}/mountinfo").read_text().splitlines()
    [line] = [entry for entry in mountinfo if entry.split()[4] == target]
    optional = line.split(" - ")[0].split()[6:]
    assert not any(tag.startswith(("shared:", "master:")) for tag in optional), line
    engine.unmount(container.id)


def _auto(engine: Engine) -> Engine:
    return Engine(EngineConfig(**{**engine.config.__dict__, "inject_driver": "auto"}))


def test_the_files_come_before_the_device_node_so_a_failed_placing_never_shows_it(
    engine: Engine, run_container, tmp_path: Path
) -> None:
    """A process must never see the GPU without its libraries: the files are placed
    before the node. Here placing fails midway (a dangling /usr/bin, absent when the plan
    looked, no directory when the tool is placed) after the libraries went in: the node
    was never made, so the container's /dev never changed, and the libraries are out."""
    rootfs = _rootfs(tmp_path / "image")
    (rootfs / "usr").mkdir(exist_ok=True)
    (rootfs / "usr/bin").symlink_to("/nowhere")
    container = run_container(rootfs)
    dev = Path(f"/proc/{container.pid}/root/dev")
    before = dev.stat()

    with pytest.raises(UnsafePath, match="/usr/bin"):
        engine.mount(container.id, [GPU], with_driver=True)

    after = dev.stat()
    assert (after.st_mtime_ns, after.st_ctime_ns) == (before.st_mtime_ns, before.st_ctime_ns)
    assert "nvidia0" not in container.ls_dev()
    assert container.exec("ls", LIB).stdout.split() == []
    assert engine.ledger.records() == [] and engine.ledger.claims() == []


def test_with_driver_on_an_engine_whose_inject_driver_is_never_is_refused(
    engine: Engine, run_container, tmp_path: Path
) -> None:
    """`never` is an off switch: a request's with_driver cannot turn it on."""
    never = Engine(EngineConfig(**{**engine.config.__dict__, "inject_driver": "never"}))
    container = run_container(_rootfs(tmp_path / "image"))

    with pytest.raises(DriverUnavailable, match="inject-driver=never"):
        never.mount(container.id, [GPU], with_driver=True)

    assert "nvidia0" not in container.ls_dev()
    assert never.ledger.records() == [] and never.ledger.claims() == []
    assert never.mount(container.id, [GPU]).driver is None
    assert _smi(container)[0] != 0


def test_auto_mounts_the_gpu_without_the_files_where_the_image_has_its_own_nvidia_smi(
    engine: Engine, run_container, tmp_path: Path
) -> None:
    """Nobody asked for the files: a target that holds the image's own file is no
    reason to refuse the GPU (with_driver=True still refuses, above)."""
    rootfs = _rootfs(tmp_path / "image")
    (rootfs / "usr/bin").mkdir(parents=True)
    (rootfs / "usr/bin/nvidia-smi").write_text("#!/bin/sh\necho the image's own\n")
    container = run_container(rootfs)

    result = _auto(engine).mount(container.id, [GPU])

    assert result.driver is None and [m.key for m in result.mounted]
    assert "nvidia0" in container.ls_dev()
    assert (rootfs / "usr/bin/nvidia-smi").read_text() == "#!/bin/sh\necho the image's own\n"
    assert not (rootfs / LIB.lstrip("/")).exists() or not list((rootfs / LIB.lstrip("/")).iterdir())


def test_unmount_takes_out_a_bind_whose_host_file_was_replaced_since(
    engine: Engine, run_container, tmp_path: Path, driver_root: Path
) -> None:
    """A driver upgrade replaces the host's files (new inodes): the binds in the
    container are still the ones we made, and unmount and reconcile know them so."""
    container = run_container(_rootfs(tmp_path / "image"))
    engine.mount(container.id, [GPU], with_driver=True)
    library = f"{LIB}/libcuda.so.{stand_in.VERSION}"
    host_file = driver_root / library.lstrip("/")
    replacement = host_file.with_name(host_file.name + ".new")
    shutil.copy2(host_file, replacement)
    os.replace(replacement, host_file)  # same bytes, a new inode: as a package upgrade

    assert engine.reconcile().recreated == 0
    gone = engine.unmount(container.id, [GPU])

    assert library in gone.driver_removed
    assert container.exec("ls", LIB).stdout.split() == []
    assert not any(library in line for line in _mountinfo(container))


def _mountinfo(container: RuncContainer) -> list[str]:
    return Path(f"/proc/{container.pid}/mountinfo").read_text().splitlines()


@pytest.fixture
def volume_at_lib(tmp_path: Path, run_container) -> RuncContainer:
    """A container whose library directory is a volume (a tmpfs mounted inside it)."""
    rootfs = _rootfs(tmp_path / "image")
    (rootfs / LIB.lstrip("/")).mkdir(parents=True)
    container = run_container(rootfs)
    enter = ["nsenter", "-t", str(container.pid), "-m", "/bin/busybox"]
    subprocess.run([*enter, "mount", "-t", "tmpfs", "volume", LIB], check=True)
    return container


def test_a_target_directory_on_a_volume_in_the_container_is_refused(
    engine: Engine, volume_at_lib: RuncContainer
) -> None:
    """RESOLVE_NO_XDEV: the driver's files go into the container's own root filesystem
    only, never across into a volume (a tenant's NFS share, a host directory)."""
    container = volume_at_lib

    with pytest.raises(UnsafePath, match="another mount"):
        engine.mount(container.id, [GPU], with_driver=True)

    assert container.exec("ls", LIB).stdout.split() == []
    assert "nvidia0" not in container.ls_dev()
    assert engine.ledger.records() == []
    result = _auto(engine).mount(container.id, [GPU])  # nobody asked: the GPU alone
    assert result.driver is None and "nvidia0" in container.ls_dev()
    assert container.exec("ls", LIB).stdout.split() == []


@pytest.mark.parametrize("source", ["cdi"], indirect=True)  # only a CDI spec has mounts
def test_a_cdi_mount_of_a_daemons_socket_directory_is_left_out(
    engine: Engine, run_container, tmp_path: Path, driver_root: Path, hook_marker: Path, source: str
) -> None:
    """Any CDI device's spec is read, and a spec may mount what its own runtime needs:
    a directory with a daemon's socket, bound, could be connected to. Only the driver's
    libraries, tools and firmware are bound; the rest is left out and said so."""
    daemon = tmp_path / "run-daemon"
    daemon.mkdir()
    listening = socket.socket(socket.AF_UNIX)
    listening.bind(str(daemon / "daemon.sock"))
    spec = _cdi_spec(driver_root, hook_marker).replace(
        "  hooks:",
        f"    - {{hostPath: {daemon}, containerPath: /run/daemon, options: [rbind]}}\n"
        f"    - {{hostPath: {daemon}/daemon.sock, containerPath: {LIB}/libdaemon.so}}\n"
        "  hooks:",
    )
    (Path(engine.config.cdi_dirs[0]) / "nvidia.yaml").write_text(spec)
    container = run_container(_rootfs(tmp_path / "image"))
    try:
        result = engine.mount(container.id, [GPU], with_driver=True)
    finally:
        listening.close()

    assert result.driver is not None and _smi(container)[0] == 0
    assert "/run/daemon" not in result.driver["files"]
    assert any("/run/daemon" in note for note in result.driver["notes"])
    assert container.exec("ls", "/run/daemon").returncode != 0
    assert "libdaemon.so" not in container.exec("ls", LIB).stdout
    assert not any(line.split()[4] == "/run/daemon" for line in _mountinfo(container))


def test_a_pid_reused_before_the_placer_opened_it_is_never_placed_into(
    engine: Engine, run_container, tmp_path: Path
) -> None:
    """The container's init exits after the operation pinned it, and its PID goes to a
    process in the host's mount namespace before /proc/PID/root is opened: the placer
    is proven right after the open and refuses, so nothing is placed into the host."""
    container = run_container(_rootfs(tmp_path / "image"))
    resolved = engine.resolve(container.id)
    with liveness.Liveness(engine._proc, resolved).enter() as alive:
        container.stop()
        wait_for(lambda: not pid_exists(resolved.init_pid), "the init's PID to be free")
        impostor = spawn_with_pid(resolved.init_pid, ["sleep", "1000"])
        try:
            with pytest.raises(ContainerNotFound), engine.driver.placer(resolved, alive.check):
                pass
        finally:
            impostor.kill()
            impostor.wait()


def test_a_mount_that_died_after_its_last_step_is_rolled_back_whole(
    engine: Engine, run_container, tmp_path: Path
) -> None:
    """The agent died after the node, the last step, before the record was final: the
    ledger holds the pending mount with its nodes and files. The next reconcile (a new
    agent) takes out the node first, then the files, and frees the claim."""
    container = run_container(_rootfs(tmp_path / "image"))
    engine.mount(container.id, [GPU], with_driver=True)
    record = engine.ledger.load(container.id)
    assert record is not None and record.driver
    record.pending = PendingOp(
        op="mount",
        devices=list(record.devices),
        nodes=list(record.nodes.values()),
        driver=record.driver,
    )
    record.devices, record.nodes, record.driver = {}, {}, []
    engine.ledger.save(record)

    report = Engine(engine.config).reconcile()

    assert report.pending_finished == 1
    assert "nvidia0" not in container.ls_dev()
    assert container.exec("ls", LIB).stdout.split() == []
    assert _smi(container)[0] != 0
    assert not any(LIB in line.split()[4] for line in _mountinfo(container))
    assert engine.ledger.claims() == []
