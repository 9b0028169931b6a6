"""Containers made by a real containerd (1.6) with the cgroup path a kubelet gives them.

A kubelet with the cgroupfs driver asks containerd for
`/kubepods/<qos>/pod<uid>/<container id>`; `ctr run --cgroup` passes exactly
that path to runc, so `/proc/<pid>/cgroup` reads as it does on a Kubernetes
node. The daemon is private to the test session: its own root, state, socket,
runc root and FIFO directory under a temporary directory, and a config that
disables the CRI plugin (no kubelet here) and the plugins that would write
outside it. Containers run with `io.containerd.runc.v2` and runc's cgroupfs
driver (ctr's default: no `--runc-systemd-cgroup`), from a plain rootfs
directory (`--rootfs`), so no image or snapshotter is involved.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

from tests.support import runc
from tests.support.runc import errno_name, new_id

NAMESPACE = "k8s.io"  # the namespace the CRI plugin uses for a kubelet's containers
CGROUP_ROOT = Path("/sys/fs/cgroup")
CONFIG = """\
version = 2
disabled_plugins = [
  "io.containerd.grpc.v1.cri",
  "io.containerd.internal.v1.opt",
  "io.containerd.snapshotter.v1.aufs",
  "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.snapshotter.v1.zfs",
]
"""
_ENOENT = "x: No such file or directory"


def missing_requirements() -> str | None:
    """Why containerd tests cannot run here, or None."""
    why = runc.missing_requirements()
    if why is not None:
        return why
    for tool in ("containerd", "ctr", "containerd-shim-runc-v2"):
        if shutil.which(tool) is None:
            return f"needs {tool} (apt-get install containerd)"
    return None


class Containerd:
    """A private containerd daemon; `stop()` deletes its containers and ends it."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        # A unix socket's path has at most 104-108 bytes, and containerd adds ".ttrpc":
        # the sockets live in a short folder of their own, not under pytest's (deep, and
        # deeper under a pytest-xdist worker).
        self.socket_dir = Path(tempfile.mkdtemp(prefix="hm-ctd-"))
        self.address = self.socket_dir / "containerd.sock"
        self.runc_root = workdir / "runc"
        self.fifo_dir = workdir / "fifo"
        self.log = workdir / "containerd.log"
        config = workdir / "config.toml"
        config.write_text(CONFIG)
        for directory in (self.runc_root, self.fifo_dir):
            directory.mkdir(parents=True, exist_ok=True)
        command = [
            "containerd",
            "--config",
            str(config),
            "--root",
            str(workdir / "root"),
            "--state",
            str(workdir / "state"),
            "--address",
            str(self.address),
        ]
        with self.log.open("w") as out:
            self.process = subprocess.Popen(
                command, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )
        try:
            self._wait_ready()
        except BaseException:
            self._end()
            raise

    def _wait_ready(self, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"containerd exited: {self.log.read_text()[-4000:]}")
            if self.address.exists() and self.ctr("version").returncode == 0:
                return
            time.sleep(0.1)
        raise RuntimeError(
            f"containerd did not answer in {timeout}s: {self.log.read_text()[-4000:]}"
        )

    def ctr(self, *args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["ctr", "--address", str(self.address), "--namespace", NAMESPACE, *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
            check=False,
        )

    def tasks(self) -> dict[str, tuple[int, str]]:
        """Container ID to its init process's PID and the task's status (`ctr task ls`)."""
        listing = self.ctr("task", "ls")
        tasks: dict[str, tuple[int, str]] = {}
        for line in listing.stdout.splitlines()[1:]:
            fields = line.split()
            if len(fields) == 3 and fields[1].isdecimal():
                tasks[fields[0]] = (int(fields[1]), fields[2])
        return tasks

    def container_ids(self) -> list[str]:
        return self.ctr("containers", "ls", "-q").stdout.split()

    def remove(self, container_id: str) -> None:
        """Kill and delete the task, then the container; quietly, whatever state it is in."""
        self.ctr("task", "kill", "--signal", "SIGKILL", container_id)
        for _ in range(100):
            if self.tasks().get(container_id, (0, "STOPPED"))[1] == "STOPPED":
                break
            time.sleep(0.05)
        deleted = self.ctr("task", "delete", container_id)
        if deleted.returncode != 0 and "not found" not in deleted.stderr:
            self.ctr("task", "delete", "--force", container_id)
        self.ctr("containers", "delete", container_id)

    def stop(self) -> None:
        try:
            for container_id in self.container_ids():
                self.remove(container_id)
        finally:
            self._end()

    def _end(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        shutil.rmtree(self.socket_dir, ignore_errors=True)


class ContainerdContainer:
    """A container of a pod, as a kubelet (cgroupfs driver) would ask containerd for it."""

    def __init__(self, daemon: Containerd, rootfs: Path, qos: str = "besteffort") -> None:
        self.daemon = daemon
        self.id = new_id()
        self.pod_uid = str(uuid.uuid4())
        self.pod_cgroup = f"/kubepods/{qos}/pod{self.pod_uid}"
        self.cgroup_path = f"{self.pod_cgroup}/{self.id}"
        self._execs = 0
        started = daemon.ctr(
            "run",
            "--detach",
            "--rootfs",
            "--runtime",
            "io.containerd.runc.v2",
            "--runc-root",
            str(daemon.runc_root),
            "--fifo-dir",
            str(daemon.fifo_dir),
            "--null-io",
            "--cgroup",
            self.cgroup_path,
            "--env",
            "PATH=/bin",
            str(rootfs),
            self.id,
            "/bin/sleep",
            "100000",
        )
        if started.returncode != 0:
            self.stop()
            raise RuntimeError(f"ctr run failed: {started.stderr}")
        pid, status = daemon.tasks().get(self.id, (0, "MISSING"))
        if status != "RUNNING":
            self.stop()
            raise RuntimeError(f"ctr run left task {self.id} {status}")
        self.pid = pid

    @property
    def v1_devices_dir(self) -> Path:
        return CGROUP_ROOT / "devices" / self.cgroup_path.lstrip("/")

    def exec(self, *command: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
        self._execs += 1
        return self.daemon.ctr(
            "task",
            "exec",
            "--exec-id",
            f"probe-{self._execs}",
            "--fifo-dir",
            str(self.daemon.fifo_dir),
            self.id,
            *command,
            timeout=timeout,
        )

    def open_result(self, path: str) -> str:
        """Open `path` read-write inside the container: OK, or the errno name."""
        # `<>` would create a missing file: test for it first.
        result = self.exec(
            "/bin/sh",
            "-c",
            f"[ -e {path} ] || {{ echo '{_ENOENT}' >&2; exit 1; }}; exec 3<>{path} && echo OPENED",
        )
        if "OPENED" in result.stdout:
            return "OK"
        return errno_name(result.stderr)

    def mknod(self, path: str, kind: str, major: int, minor: int) -> None:
        """Make a node from inside the container (its devices cgroup allows `m` for all)."""
        made = self.exec("/bin/mknod", path, kind, str(major), str(minor))
        assert made.returncode == 0, f"mknod {path} in {self.id}: {made.stderr}"

    def ls_dev(self) -> list[str]:
        return sorted(self.exec("/bin/ls", "/dev").stdout.split())

    def stop(self) -> None:
        """Delete the container, then the cgroups it leaves in every hierarchy."""
        try:
            self.daemon.remove(self.id)
        finally:
            remove_cgroup_dirs(self.cgroup_path)


def cgroup_hierarchies() -> list[Path]:
    """Every mounted hierarchy: each v1 controller, named v1 ones, and `unified`."""
    return sorted(
        p for p in CGROUP_ROOT.iterdir() if p.is_dir() and not p.is_symlink() and _is_cgroup(p)
    )


def _is_cgroup(directory: Path) -> bool:
    return (directory / "cgroup.procs").exists()


def remove_cgroup_dirs(cgroup_path: str) -> None:
    """rmdir `cgroup_path` and then each parent that is left empty, in every hierarchy.

    rmdir on a cgroup that still has children or processes fails, so parents
    another container (or a kubelet) still uses are left alone.
    """
    parts = [p for p in cgroup_path.split("/") if p]
    roots = cgroup_hierarchies() if CGROUP_ROOT.is_dir() else []
    for root in roots:
        for depth in range(len(parts), 0, -1):
            directory = root.joinpath(*parts[:depth])
            # The leaf may hold a dying process for a moment after the task's delete.
            if not _rmdir(directory, patience=5.0 if depth == len(parts) else 0.0):
                break


def _rmdir(directory: Path, patience: float) -> bool:
    """True once `directory` is gone; False while it stays busy (children, processes)."""
    deadline = time.monotonic() + patience
    while True:
        try:
            os.rmdir(directory)
            return True
        except FileNotFoundError:
            return True
        except OSError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)
