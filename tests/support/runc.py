"""Real containers for kernel tests: runc with a busybox-static rootfs, in both cgroup modes.

v1 (hybrid host, the default here): runc puts the container in
`/sys/fs/cgroup/devices/<id>` with deny-all plus its allow list.
v2: runc runs in a private mount namespace whose `/sys/fs/cgroup` is the
cgroup2 hierarchy, so it attaches its own BPF device program; the host sees
that cgroup at `/sys/fs/cgroup/unified/<id>`. Every runc command for a v2
container runs in such a namespace, or runc would look for v1 cgroups.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import subprocess
import time
from pathlib import Path

BUSYBOX_APPLETS = ("sh", "ls", "cat", "sleep", "mknod", "echo", "ln", "rm", "stat", "true")
_ENOENT = "x: No such file or directory"
_V2_PREFIX = (
    "mount --make-rprivate / && umount -l /sys/fs/cgroup && "
    'mount -t cgroup2 none /sys/fs/cgroup && exec runc "$@"'
)


def missing_requirements() -> str | None:
    """Why kernel tests cannot run here, or None."""
    if os.geteuid() != 0:
        return "needs root (cgroups, bpf(), mknod in a container's namespace)"
    for tool in ("runc", "unshare", "nsenter"):
        if shutil.which(tool) is None:
            return f"needs {tool} (apt-get install runc util-linux)"
    if busybox() is None:
        return "needs a static busybox (apt-get install busybox-static)"
    return None


def busybox() -> Path | None:
    """A statically linked busybox: it must run inside a rootfs with no libc."""
    for candidate in ("/bin/busybox", "/usr/bin/busybox"):
        path = Path(candidate)
        if path.exists() and b"ld-linux" not in path.read_bytes()[:65536]:
            return path
    return None


def make_rootfs(directory: Path) -> Path:
    rootfs = directory / "rootfs"
    (rootfs / "bin").mkdir(parents=True)
    box = busybox()
    assert box is not None
    shutil.copy(box, rootfs / "bin" / "busybox")
    for applet in BUSYBOX_APPLETS:
        (rootfs / "bin" / applet).symlink_to("busybox")
    for extra in ("tmp", "proc", "sys", "dev"):
        (rootfs / extra).mkdir()
    return rootfs


def new_id() -> str:
    return secrets.token_hex(32)


class RuncContainer:
    """One running container; `mode` is "v1" or "v2".

    `share_pid_with`: join that container's PID namespace, as the containers of a
    `shareProcessNamespace` pod join their pause container's.
    `share_net_with`: join that container's network namespace, as every container of a
    pod joins its sandbox's (and a restarted one joins it again).
    """

    def __init__(
        self,
        workdir: Path,
        rootfs: Path,
        mode: str,
        args: list[str] | None = None,
        share_pid_with: RuncContainer | None = None,
        share_net_with: RuncContainer | None = None,
        readonly_root: bool = False,
        nofile: int | None = None,
        private_tmp: bool = False,
    ):
        self.mode = mode
        self._stopped = False
        self.id = new_id()
        self.bundle = workdir / f"bundle-{self.id[:12]}"
        self.state_root = workdir / f"runc-{mode}"
        self.bundle.mkdir(parents=True)
        subprocess.run(["runc", "spec"], cwd=self.bundle, check=True)
        config = json.loads((self.bundle / "config.json").read_text())
        config["process"]["terminal"] = False
        config["process"]["args"] = args or ["sleep", "100000"]
        config["root"] = {"path": str(rootfs), "readonly": readonly_root}
        if private_tmp:  # a /tmp of its own: containers made from one rootfs share its /tmp
            config["mounts"].append(
                {"destination": "/tmp", "type": "tmpfs", "source": "tmpfs",
                 "options": ["nosuid", "nodev", "mode=1777"]}
            )  # fmt: skip
        if nofile is not None:  # RLIMIT_NOFILE, as a runtime's defaults allow
            config["process"]["rlimits"] = [
                {"type": "RLIMIT_NOFILE", "hard": nofile, "soft": nofile}
            ]
        if share_pid_with is not None:
            for namespace in config["linux"]["namespaces"]:
                if namespace["type"] == "pid":
                    namespace["path"] = f"/proc/{share_pid_with.pid}/ns/pid"
        if share_net_with is not None:  # a pod's container in its sandbox's network namespace
            for namespace in config["linux"]["namespaces"]:
                if namespace["type"] == "network":
                    namespace["path"] = f"/proc/{share_net_with.pid}/ns/net"
        (self.bundle / "config.json").write_text(json.dumps(config))
        # Detached: the container would keep captured pipes open forever.
        log = self.bundle / "run.log"
        with log.open("w") as out:
            started = self._runc(["run", "-d", "--bundle", str(self.bundle), self.id], output=out)
        if started.returncode != 0:
            raise RuntimeError(f"runc run failed: {log.read_text()}")
        self.pid = int(self.state()["pid"])

    def _runc(
        self, args: list[str], check: bool = False, timeout: float = 30, output: object = None
    ) -> subprocess.CompletedProcess[str]:
        command = ["runc", "--root", str(self.state_root), *args]
        if self.mode == "v2":
            command = ["unshare", "-m", "sh", "-c", _V2_PREFIX, "sh", *command[1:]]
        if output is not None:
            return subprocess.run(
                command,
                stdout=output,
                stderr=subprocess.STDOUT,
                text=True,
                check=check,
                timeout=timeout,
                stdin=subprocess.DEVNULL,
            )
        return subprocess.run(
            command,
            capture_output=True,
            text=True,
            check=check,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )

    def state(self) -> dict[str, object]:
        return json.loads(self._runc(["state", self.id], check=True).stdout)

    @property
    def v1_devices_dir(self) -> Path:
        return Path("/sys/fs/cgroup/devices") / self.id

    @property
    def v2_dir(self) -> Path:
        return Path("/sys/fs/cgroup/unified") / self.id

    def exec(self, *command: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
        return self._runc(["exec", self.id, *command], timeout=timeout)

    def exec_in_background(self, *command: str) -> subprocess.Popen[bytes]:
        """`runc exec` that keeps running (a `kubectl exec` session); kill it to end it."""
        argv = self.exec_argv(*command)
        return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)

    def exec_argv(self, *command: str, exec_options: tuple[str, ...] = ()) -> list[str]:
        """The command line of `runc exec [exec_options] ID command...` for this mode."""
        argv = ["runc", "--root", str(self.state_root), "exec", *exec_options, self.id, *command]
        if self.mode == "v2":
            argv = ["unshare", "-m", "sh", "-c", _V2_PREFIX, "sh", *argv[1:]]
        return argv

    @property
    def cgroup_dir(self) -> Path:
        """Where the host finds the container's processes (`cgroup.procs`)."""
        return self.v2_dir if self.mode == "v2" else self.v1_devices_dir

    def open_result(self, path: str) -> str:
        """Open `path` read-write inside the container: OK, or the errno name."""
        # `<>` would create a missing file: test for it first.
        result = self.exec(
            "sh",
            "-c",
            f"[ -e {path} ] || {{ echo '{_ENOENT}' >&2; exit 1; }}; exec 3<>{path} && echo OPENED",
        )
        if "OPENED" in result.stdout:
            return "OK"
        return errno_name(result.stderr)

    def hold(self, path: str) -> subprocess.Popen[bytes]:
        """A process in the container that keeps `path` open until killed."""
        script = f"[ -c {path} ] && exec 3<>{path} && echo HELD && exec sleep 100000"
        command = ["runc", "--root", str(self.state_root), "exec", self.id, "sh", "-c", script]
        if self.mode == "v2":
            command = ["unshare", "-m", "sh", "-c", _V2_PREFIX, "sh", *command[1:]]
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL)
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert b"HELD" in line, f"could not hold {path} open"
        return proc

    def mknod_as_runtime(self, path: str, kind: str, major: int, minor: int) -> None:
        """Make a node the way a runtime or an admin would: from outside the cgroup."""
        enter = ["nsenter", "-t", str(self.pid), "-m"]
        subprocess.run(
            [*enter, "/bin/mknod", path, kind, str(major), str(minor)],
            check=True,
            capture_output=True,
        )

    def ls_dev(self) -> list[str]:
        return sorted(self.exec("ls", "/dev").stdout.split())

    def stop(self) -> None:
        """Kill and delete the container and its cgroups; a second call does nothing.

        Tests stop a container themselves (a restart, a crash) and the fixture stops every
        container again at teardown: without the flag each such second stop polled
        `runc delete` for five seconds on a container that no longer existed."""
        if self._stopped:
            return
        self._stopped = True
        self._runc(["kill", self.id, "KILL"])
        for _ in range(50):
            deleted = self._runc(["delete", self.id])
            if deleted.returncode == 0 or "does not exist" in deleted.stderr:
                break
            time.sleep(0.1)
        else:
            self._runc(["delete", "--force", self.id])
        for directory in (self.v1_devices_dir, self.v2_dir):
            if directory.exists():
                _rmdir_tree(directory)
        shutil.rmtree(self.bundle, ignore_errors=True)


def _rmdir_tree(directory: Path) -> None:
    for child in sorted(directory.rglob("*"), reverse=True):
        if child.is_dir():
            child.rmdir()
    directory.rmdir()


_ERRNO_TEXT = {
    "Operation not permitted": "EPERM",
    "No such device or address": "ENXIO",
    "No such file or directory": "ENOENT",
    "Permission denied": "EACCES",
    "No such device": "ENODEV",
}


def errno_name(stderr: str) -> str:
    for text, name in _ERRNO_TEXT.items():
        if text in stderr:
            return name
    match = re.search(r"can't open '[^']*': (.*)", stderr)
    return match.group(1).strip() if match else f"UNKNOWN({stderr.strip()!r})"
