"""A FUSE server that can stop answering: the stand-in for a tenant's NFS server that
was switched off.

It speaks the kernel's FUSE protocol on /dev/fuse directly (no libfuse on the test
machines): a root directory with one regular file, `file`. Attributes are never
cached (valid for 0 s), so every `stat` of an open fd asks the server. After `hang()`
it reads requests and answers none: whoever stats, looks up or opens there waits
until `close()` aborts the connection (pending requests then fail with ENOTCONN).

The mount is made inside a container's mount namespace (a forked child setns'es in),
as a pod's volume would be; `nodev=False` makes it dev-capable like a volume the
kubelet mounted.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import os
import stat
import struct
import subprocess
import threading
import warnings

from tests.support.runc import _V2_PREFIX, RuncContainer

_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
CLONE_NEWNS, CLONE_FS, MS_NODEV = 0x00020000, 0x00000200, 0x4
MNT_DETACH = 0x2

LOOKUP, FORGET, GETATTR, OPEN, READ, STATFS, RELEASE = 1, 2, 3, 14, 15, 17, 18
FLUSH, INIT, OPENDIR, READDIR, RELEASEDIR, INTERRUPT, DESTROY = 25, 26, 27, 28, 29, 36, 38
BATCH_FORGET = 42
_IN_HEADER = struct.Struct("<IIQQIIIHH")  # len, opcode, unique, nodeid, uid, gid, pid, ...
_OUT_HEADER = struct.Struct("<IiQ")  # len, error, unique
_ATTR = struct.Struct("<QQQQQQIIIIIIIIII")
_ROOT, _FILE = 1, 2


def _attr(node: int) -> bytes:
    mode = (stat.S_IFDIR | 0o755) if node == _ROOT else (stat.S_IFREG | 0o644)
    nlink = 2 if node == _ROOT else 1
    return _ATTR.pack(node, 0, 0, 0, 0, 0, 0, 0, 0, mode, nlink, 0, 0, 0, 4096, 0)


class HungFuse:
    def __init__(self) -> None:
        self.fd = os.open("/dev/fuse", os.O_RDWR | os.O_CLOEXEC)
        self._hung = threading.Event()
        self._closed = False
        self.pending = 0  # requests left unanswered since hang()
        self.connection: int | None = None  # /sys/fs/fuse/connections/<n>
        self._thread = threading.Thread(target=self._serve, name="hung-fuse", daemon=True)

    def mount_in(self, ns_pid: int, target: str, *, nodev: bool = False) -> None:
        """Mount at `target` (made if missing) in the mount namespace of `ns_pid`."""
        ns_fd = os.open(f"/proc/{ns_pid}/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
        options = f"fd={self.fd},rootmode=40000,user_id=0,group_id=0".encode()
        os.set_inheritable(self.fd, True)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)
                pid = os.fork()
            if pid == 0:  # pragma: no cover - the child
                code = 1
                try:
                    _libc.unshare(CLONE_FS)
                    if _libc.setns(ns_fd, CLONE_NEWNS) == 0:
                        os.makedirs(target, 0o755, exist_ok=True)
                        flags = MS_NODEV if nodev else 0
                        ok = _libc.mount(b"hung", target.encode(), b"fuse", flags, options)
                        code = 0 if ok == 0 else 2
                finally:
                    os._exit(code)
            _, status = os.waitpid(pid, 0)
        finally:
            os.set_inheritable(self.fd, False)
            os.close(ns_fd)
        assert os.waitstatus_to_exitcode(status) == 0, f"could not mount FUSE at {target}"
        self._thread.start()  # /dev/fuse can be read once it is mounted
        self.connection = os.minor(os.stat(f"/proc/{ns_pid}/root{target}").st_dev)

    def hang(self) -> None:
        """From now on, answer nothing."""
        self._hung.set()

    def close(self) -> None:
        """Abort the connection: every waiter gets ENOTCONN; the server thread ends."""
        if self._closed:
            return
        self._closed = True
        if self.connection is not None:
            _abort(self.connection)
            self._thread.join(timeout=10)
        os.close(self.fd)

    def _serve(self) -> None:
        while not self._closed:
            try:
                request = os.read(self.fd, 1 << 20)
            except OSError as exc:
                if exc.errno in (errno.EINTR, errno.ENOENT):
                    continue
                return  # ENODEV: unmounted or aborted
            _, opcode, unique, node, *_ = _IN_HEADER.unpack_from(request)
            if opcode in (FORGET, BATCH_FORGET, INTERRUPT):
                continue  # no answer expected
            if self._hung.is_set():
                self.pending += 1
                continue
            error, body = self._answer(opcode, node, request[_IN_HEADER.size :])
            header = _OUT_HEADER.pack(_OUT_HEADER.size + len(body), -error, unique)
            with contextlib.suppress(OSError):  # the waiter was interrupted meanwhile
                os.write(self.fd, header + body)

    def _answer(self, opcode: int, node: int, arg: bytes) -> tuple[int, bytes]:
        if opcode == INIT:
            _major, minor, readahead, _flags = struct.unpack_from("<IIII", arg)
            init = struct.pack("<IIIIHHIIHHI", 7, min(minor, 31), readahead, 0, 16, 12,
                               1 << 17, 1, 32, 0, 0)  # fmt: skip
            return 0, init + bytes(64 - len(init))
        if opcode == LOOKUP:
            if node != _ROOT or arg.rstrip(b"\0") != b"file":
                return errno.ENOENT, b""
            return 0, struct.pack("<QQQQII", _FILE, 0, 0, 0, 0, 0) + _attr(_FILE)
        if opcode == GETATTR:
            return 0, struct.pack("<QII", 0, 0, 0) + _attr(node)
        if opcode in (OPEN, OPENDIR):
            return 0, struct.pack("<QII", 0, 0, 0)
        if opcode in (READ, READDIR):
            return 0, b""
        if opcode in (RELEASE, RELEASEDIR, FLUSH, DESTROY):
            return 0, b""
        return errno.ENOSYS, b""


def _abort(connection: int) -> None:
    """Write `abort` of the connection in a fusectl of our own (the host may have none
    mounted at /sys/fs/fuse/connections), mounted in a private mount namespace."""
    script = (
        "mount -t fusectl fusectl /sys/fs/fuse/connections && "
        f"echo 1 > /sys/fs/fuse/connections/{connection}/abort"
    )
    subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", script],
                   check=True, timeout=30)  # fmt: skip


def hold_file(container: RuncContainer, path: str) -> subprocess.Popen[bytes]:
    """A process in the container with `path` open (any file, unlike `hold`), until the
    container stops."""
    script = f"exec 3<{path} && echo HELD && exec sleep 100000"
    command = ["runc", "--root", str(container.state_root), "exec", container.id]
    command += ["sh", "-c", script]
    if container.mode == "v2":
        command = ["unshare", "-m", "sh", "-c", _V2_PREFIX, "sh", *command[1:]]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL)
    assert proc.stdout is not None
    assert b"HELD" in proc.stdout.readline(), f"could not hold {path} open"
    return proc
