"""CUDA's checkpoint API (`cuCheckpointProcess*`, cuda.h) through the node's own
libcuda.so.1, loaded with ctypes from the driver root: never a library the container
could have placed. Each call runs in a forked child with a deadline
(hotmount/tenantfs/forked.py): a driver call that hangs costs one call, never the agent, and
the agent's own process never loads the driver's library.
"""

from __future__ import annotations

import ctypes
import uuid as uuidlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from hotmount.driver.files import library_dirs
from hotmount.errors import KernelError
from hotmount.tenantfs import forked

# cuDriverGetVersion reports the CUDA version a driver supports: 12.4 came with the 550
# branch (the first with the checkpoint calls), 13.0 with 580 (a restore onto other GPUs).
CUDA_OF_DRIVER_550 = 12040
CUDA_OF_DRIVER_580 = 13000

STATES = {0: "running", 1: "locked", 2: "checkpointed", 3: "failed"}
_ERRORS = {
    1: "CUDA_ERROR_INVALID_VALUE",
    3: "CUDA_ERROR_NOT_INITIALIZED",
    101: "CUDA_ERROR_INVALID_DEVICE",
    304: "CUDA_ERROR_OPERATING_SYSTEM",
    401: "CUDA_ERROR_ILLEGAL_STATE",
    500: "CUDA_ERROR_NOT_FOUND",
    801: "CUDA_ERROR_NOT_SUPPORTED",
    909: "CUDA_ERROR_TIMEOUT",
    999: "CUDA_ERROR_UNKNOWN",
}


_T = TypeVar("_T")


class CudaError(KernelError):
    """A checkpoint call answered something other than CUDA_SUCCESS."""

    reason = "CudaError"

    def __init__(self, message: str, code: int = 999) -> None:
        super().__init__(message)
        self.code = code


class _Uuid(ctypes.Structure):
    _fields_ = [("bytes", ctypes.c_ubyte * 16)]  # raw bytes: a c_char array stops at a NUL


class _GpuPair(ctypes.Structure):
    _fields_ = [("oldUuid", _Uuid), ("newUuid", _Uuid)]


class _LockArgs(ctypes.Structure):
    _fields_ = [
        ("timeoutMs", ctypes.c_uint),
        ("reserved0", ctypes.c_uint),
        ("reserved1", ctypes.c_uint64 * 7),
    ]


class _Reserved(ctypes.Structure):  # CUcheckpointCheckpointArgs, CUcheckpointUnlockArgs
    _fields_ = [("reserved", ctypes.c_uint64 * 8)]


class _RestoreArgs(ctypes.Structure):
    _fields_ = [
        ("gpuPairs", ctypes.POINTER(_GpuPair)),
        ("gpuPairsCount", ctypes.c_uint),
        ("reserved", ctypes.c_char * (52 - ctypes.sizeof(ctypes.c_void_p))),
        ("reserved1", ctypes.c_uint64),
    ]


assert ctypes.sizeof(_LockArgs) == 64 and ctypes.sizeof(_RestoreArgs) == 64


def find_libcuda(root: Path) -> Path | None:
    """libcuda.so.1 (or the versioned file it names) under a driver root."""
    for directory in library_dirs():
        base = root / directory.lstrip("/")
        if (base / "libcuda.so.1").exists():
            return base / "libcuda.so.1"
        versioned = sorted(base.glob("libcuda.so.[0-9]*.*")) if base.is_dir() else []
        if versioned:
            return versioned[-1]
    return None


def uuid_bytes(gpu_uuid: str) -> bytes:
    """`GPU-<uuid>` (or `MIG-<uuid>`) as CUuuid's 16 bytes."""
    return uuidlib.UUID(gpu_uuid.split("-", 1)[1]).bytes


@dataclass(frozen=True)
class CheckpointApi:
    """One node's libcuda.so.1; `deadline`: the longest a checkpoint or restore may take."""

    library: Path
    deadline: float = 600.0

    def version(self) -> int:
        return self._run("cuDriverGetVersion", _version, 30.0)

    def state(self, pid: int) -> str:
        return self._run(f"the state of PID {pid}", lambda lib: _state(lib, pid), 30.0)

    def lock(self, pid: int, timeout: float) -> None:
        ms = max(1, int(timeout * 1000))
        self._run(f"locking PID {pid}", lambda lib: _lock(lib, pid, ms), timeout + 30.0)

    def checkpoint(self, pid: int) -> None:
        self._run(f"checkpointing PID {pid}", lambda lib: _plain(lib, "Checkpoint", pid))

    def restore(self, pid: int, pairs: list[tuple[str, str]]) -> None:
        self._run(f"restoring PID {pid}", lambda lib: _restore(lib, pid, pairs))

    def unlock(self, pid: int) -> None:
        self._run(f"unlocking PID {pid}", lambda lib: _plain(lib, "Unlock", pid), 60.0)

    def _run(
        self, what: str, call: Callable[[ctypes.CDLL], _T], deadline: float | None = None
    ) -> _T:
        path = str(self.library)

        def work() -> _T:  # pragma: no cover - runs in a child
            try:
                lib = ctypes.CDLL(path)
            except OSError as exc:
                raise KernelError(f"loading the node's {path}: {exc}") from exc
            return call(lib)

        return forked.run(work, what, deadline=deadline or self.deadline)


def _check(code: int, what: str) -> None:
    if code != 0:
        name = _ERRORS.get(code, f"CUresult {code}")
        raise CudaError(f"{what}: {name}", code)


def _entry(lib: ctypes.CDLL, name: str) -> ctypes._CFuncPtr:  # type: ignore[name-defined]
    try:
        return getattr(lib, name)
    except AttributeError as exc:
        message = f"the node's libcuda has no {name}: the driver is older than 550"
        raise CudaError(message, 801) from exc


def _version(lib: ctypes.CDLL) -> int:  # pragma: no cover - runs in a child
    value = ctypes.c_int()
    _check(_entry(lib, "cuDriverGetVersion")(ctypes.byref(value)), "cuDriverGetVersion")
    return value.value


def _state(lib: ctypes.CDLL, pid: int) -> str:  # pragma: no cover - runs in a child
    value = ctypes.c_int()
    code = _entry(lib, "cuCheckpointProcessGetState")(pid, ctypes.byref(value))
    _check(code, f"cuCheckpointProcessGetState({pid})")
    return STATES.get(value.value, f"state {value.value}")


def _lock(lib: ctypes.CDLL, pid: int, ms: int) -> None:  # pragma: no cover - runs in a child
    args = _LockArgs(timeoutMs=ms)
    _check(_entry(lib, "cuCheckpointProcessLock")(pid, ctypes.byref(args)),
           f"cuCheckpointProcessLock({pid}, {ms} ms)")  # fmt: skip


def _plain(lib: ctypes.CDLL, step: str, pid: int) -> None:  # pragma: no cover - runs in a child
    args = _Reserved()
    name = f"cuCheckpointProcess{step}"
    _check(_entry(lib, name)(pid, ctypes.byref(args)), f"{name}({pid})")


def _restore(
    lib: ctypes.CDLL, pid: int, pairs: list[tuple[str, str]]
) -> None:  # pragma: no cover - runs in a child
    array = (_GpuPair * max(1, len(pairs)))()
    for i, (old, new) in enumerate(pairs):
        array[i].oldUuid.bytes[:] = list(uuid_bytes(old))
        array[i].newUuid.bytes[:] = list(uuid_bytes(new))
    args = _RestoreArgs(gpuPairsCount=len(pairs))
    if pairs:
        args.gpuPairs = ctypes.cast(array, ctypes.POINTER(_GpuPair))
    _check(_entry(lib, "cuCheckpointProcessRestore")(pid, ctypes.byref(args)),
           f"cuCheckpointProcessRestore({pid})")  # fmt: skip
