"""Every path into `/proc/PID`: built here alone, and pinned where it opens a door.

Reading procfs text (`stat`, `status`, `cgroup`, `comm`, `mountinfo`, a namespace's
name) asks no tenant's filesystem: the kernel prints it from memory. So these reads run
in the agent's own process. What they name can still change under them: a PID exits
and goes to another process. `ProcessDir` pins one process for work that opens its
root, its mount namespace or its mount table: a pidfd first, then an fd of its
`/proc/PID` directory, then proof that the pidfd's process has not exited (so that PID
was never reused in between and the directory is the pidfd's process), and, where the
caller says which container it expects, that the process is in its cgroups. Every
entry is then opened from that directory fd, which names that one process for as long
as it is open (a reused PID gets a directory of its own).

`proc` is where the host's /proc is seen (`HostRoot.proc`; tests point it elsewhere).
"""

from __future__ import annotations

import os
import select
from collections.abc import Callable
from pathlib import Path

from hotmount.errors import ContainerNotFound

_DIR = os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC


def _entry(proc: str | Path, pid: int | str, name: str) -> str:
    return f"{os.fspath(proc)}/{pid}/{name}"


def read(proc: str | Path, pid: int, name: str, size: int = 65536) -> bytes:
    """One read of /proc/PID/`name` (os-level: the mount hot path); OSError as it comes."""
    fd = os.open(_entry(proc, pid, name), os.O_RDONLY | os.O_CLOEXEC)
    try:
        return os.read(fd, size)
    finally:
        os.close(fd)


def read_text(proc: str | Path, pid: int, name: str) -> str:
    """The whole of /proc/PID/`name` as text; OSError as it comes."""
    with open(_entry(proc, pid, name)) as entry:
        return entry.read()


def namespace(proc: str | Path, pid: int | str, kind: str) -> str:
    """The name of the process's namespace `kind` (`mnt:[4026531841]`); OSError as it
    comes. `pid` may be "self" (this process's own)."""
    return os.readlink(_entry(proc, pid, f"ns/{kind}"))


def namespace_path(proc: str | Path, pid: int, kind: str) -> str:
    """Where the namespace's link is, for messages (open it with `open_namespace`)."""
    return _entry(proc, pid, f"ns/{kind}")


def namespace_inode(proc: str | Path, pid: int | str, kind: str) -> int:
    """The inode of the process's namespace `kind`; OSError as it comes."""
    return os.stat(_entry(proc, pid, f"ns/{kind}")).st_ino


def open_namespace(proc: str | Path, pid: int, kind: str) -> int:
    """An fd of the process's namespace `kind` (for setns, or to compare); OSError as it
    comes. Prove the PID is still the process meant after it (or use `ProcessDir`)."""
    return os.open(_entry(proc, pid, f"ns/{kind}"), os.O_RDONLY | os.O_CLOEXEC)


def pids(proc: str | Path) -> list[int]:
    """Every PID /proc lists now."""
    with os.scandir(proc) as entries:
        return [int(entry.name) for entry in entries if entry.name.isdigit()]


def comm(proc: str | Path, pid: int) -> str:
    """The process's command name, "?" where it has exited."""
    try:
        return read_text(proc, pid, "comm").strip()
    except OSError:
        return "?"


def fd_table_size(proc: str | Path, pid: int) -> int:
    """`FDSize` of /proc/PID/status: the process's fd table (0 where it cannot be read)."""
    try:
        text = read(proc, pid, "status", 1 << 16)
    except OSError:
        return 0
    at = text.find(b"FDSize:")
    return int(text[at + 7 :].split(None, 1)[0]) if at >= 0 else 0


class OpenFds:
    """One process's fds, as /proc/PID/fd and fdinfo show them (for the scan of open files,
    which runs in a bounded worker: `stat` follows an fd into its file)."""

    def __init__(self, proc: str | Path, pid: int) -> None:
        self.base = _entry(proc, pid, "")

    def mount_namespace(self) -> str:
        return os.readlink(self.base + "ns/mnt")

    def mountinfo(self) -> str:
        return self.base + "mountinfo"

    def names(self) -> os._ScandirIterator[str]:  # typeshed's name for scandir's iterator
        """Streamed: no list of every fd (a tenant may hold hundreds of thousands); close
        it (`with`) when done."""
        return os.scandir(self.base + "fd")

    def target(self, fd: int | str) -> str:
        """What procfs prints for the fd (asks the file's filesystem nothing)."""
        return os.readlink(f"{self.base}fd/{fd}")

    def fdinfo(self, fd: int | str) -> str:
        return f"{self.base}fdinfo/{fd}"

    def follow(self, fd: int | str) -> os.stat_result:
        """`stat` through the fd's magic link: this asks the file's own filesystem, so
        only ever in a bounded child."""
        return os.stat(f"{self.base}fd/{fd}")


def exited(pidfd: int) -> bool:
    """Whether the pidfd's process has exited (its pidfd polls readable), without waiting."""
    watch = select.poll()
    watch.register(pidfd, select.POLLIN)
    return bool(watch.poll(0))


class ProcessDir:
    """One process's /proc directory, pinned (see the module's docstring). Close it.

    `owns`: given the process's /proc/PID/cgroup, whether it is the container's (as
    resolved: `Container.owns`); a process in other cgroups now (its PID reused by another
    container's process, or the host's) is ContainerNotFound."""

    def __init__(
        self, proc: str | Path, pid: int, owns: Callable[[bytes], bool] | None = None
    ) -> None:
        self.pid = pid
        try:
            self.pidfd = os.pidfd_open(pid)
        except ProcessLookupError as exc:
            raise ContainerNotFound(f"process {pid} has exited") from exc
        try:
            try:
                self.fd = os.open(_entry(proc, pid, ""), _DIR)
            except (FileNotFoundError, ProcessLookupError) as exc:
                raise ContainerNotFound(f"process {pid} has exited") from exc
            try:
                self.check()
                if owns is not None and not owns(self.read("cgroup", 1 << 16)):
                    raise ContainerNotFound(
                        f"PID {pid} is not the container's process any more (other cgroups)"
                    )
            except BaseException:
                os.close(self.fd)
                raise
        except BaseException:
            os.close(self.pidfd)
            raise

    def check(self) -> None:
        """ContainerNotFound once the process has exited."""
        if exited(self.pidfd):
            raise ContainerNotFound(f"process {self.pid} has exited")

    def read(self, name: str, size: int) -> bytes:
        try:
            fd = os.open(name, os.O_RDONLY | os.O_CLOEXEC, dir_fd=self.fd)
        except (FileNotFoundError, ProcessLookupError) as exc:
            raise ContainerNotFound(f"process {self.pid} has exited") from exc
        try:
            return os.read(fd, size)
        except ProcessLookupError as exc:
            raise ContainerNotFound(f"process {self.pid} has exited") from exc
        finally:
            os.close(fd)

    def namespace(self, kind: str) -> str:
        """The name of the process's namespace `kind` (`mnt:[4026531841]`)."""
        try:
            return os.readlink(f"ns/{kind}", dir_fd=self.fd)
        except (FileNotFoundError, ProcessLookupError) as exc:
            raise ContainerNotFound(f"process {self.pid} has exited") from exc

    def dup(self) -> ProcessDir:
        """Another owner of the same pin (its own fds, to close on its own): what was proven
        of this one holds for it, since both name the same process and nothing else."""
        twin = object.__new__(ProcessDir)
        twin.pid = self.pid
        twin.pidfd = os.dup(self.pidfd)
        try:
            twin.fd = os.dup(self.fd)
        except BaseException:
            os.close(twin.pidfd)
            raise
        return twin

    def open_root(self) -> int:
        """An O_PATH fd of the process's root directory (through the magic link `root`:
        the one symlink this door follows on purpose, to the tenant's own `/`)."""
        return self._open("root", _DIR)

    def open_namespace(self, kind: str) -> int:
        return self._open(f"ns/{kind}", os.O_RDONLY | os.O_CLOEXEC)

    def _open(self, name: str, flags: int) -> int:
        try:
            fd = os.open(name, flags, dir_fd=self.fd)
        except (FileNotFoundError, ProcessLookupError) as exc:
            raise ContainerNotFound(f"process {self.pid} has exited") from exc
        try:
            self.check()  # belt and braces: an entry of a process that exited meanwhile
        except BaseException:
            os.close(fd)
            raise
        return fd

    def close(self) -> None:
        """Idempotent: an owner that took it over may close it too."""
        if self.fd >= 0:
            os.close(self.fd)
            os.close(self.pidfd)
            self.fd = self.pidfd = -1

    def __enter__(self) -> ProcessDir:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
