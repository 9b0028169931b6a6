"""The bpf() system call through ctypes: the only module that issues it.

Each `bpf_attr` variant is declared once, with the kernel header it comes from
(include/uapi/linux/bpf.h). Every attr is padded to 256 zeroed bytes: the
kernel reads only what it knows, and since 6.17 writes `query.revision` at
offset 56, past the end of a short struct. A failed program load is retried
with the verifier log on, and the log goes into the error.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
from dataclasses import dataclass

from hotmount.errors import BpfError

SYS_BPF = {"x86_64": 321, "aarch64": 280}

# enum bpf_cmd
BPF_MAP_CREATE = 0
BPF_MAP_LOOKUP_ELEM = 1
BPF_MAP_UPDATE_ELEM = 2
BPF_MAP_DELETE_ELEM = 3
BPF_MAP_GET_NEXT_KEY = 4
BPF_PROG_LOAD = 5
BPF_PROG_ATTACH = 8
BPF_PROG_DETACH = 9
BPF_PROG_GET_NEXT_ID = 11
BPF_MAP_GET_NEXT_ID = 12
BPF_PROG_GET_FD_BY_ID = 13
BPF_MAP_GET_FD_BY_ID = 14
BPF_OBJ_GET_INFO_BY_FD = 15
BPF_PROG_QUERY = 16

BPF_MAP_TYPE_HASH = 1
BPF_PROG_TYPE_CGROUP_DEVICE = 15
BPF_CGROUP_DEVICE = 6  # enum bpf_attach_type
BPF_F_ALLOW_OVERRIDE = 1
BPF_F_ALLOW_MULTI = 2
BPF_F_REPLACE = 4
BPF_ANY = 0

ATTR_SIZE = 256
_u32, _u64 = ctypes.c_uint32, ctypes.c_uint64


def _padded(name: str, fields: list[tuple[str, type]]) -> type[ctypes.Structure]:
    body = type(f"_{name}Body", (ctypes.Structure,), {"_fields_": fields})
    pad = ATTR_SIZE - ctypes.sizeof(body)
    return type(name, (ctypes.Structure,), {"_fields_": [*fields, ("_pad", ctypes.c_uint8 * pad)]})


# union bpf_attr, BPF_MAP_CREATE
MapCreateAttr = _padded(
    "MapCreateAttr",
    [
        ("map_type", _u32),
        ("key_size", _u32),
        ("value_size", _u32),
        ("max_entries", _u32),
        ("map_flags", _u32),
        ("inner_map_fd", _u32),
        ("numa_node", _u32),
        ("map_name", ctypes.c_char * 16),
    ],
)
# BPF_MAP_*_ELEM and BPF_MAP_GET_NEXT_KEY
MapElemAttr = _padded(
    "MapElemAttr",
    [("map_fd", _u32), ("_pad0", _u32), ("key", _u64), ("value", _u64), ("flags", _u64)],
)
# BPF_PROG_LOAD
ProgLoadAttr = _padded(
    "ProgLoadAttr",
    [
        ("prog_type", _u32),
        ("insn_cnt", _u32),
        ("insns", _u64),
        ("license", _u64),
        ("log_level", _u32),
        ("log_size", _u32),
        ("log_buf", _u64),
        ("kern_version", _u32),
        ("prog_flags", _u32),
        ("prog_name", ctypes.c_char * 16),
        ("prog_ifindex", _u32),
        ("expected_attach_type", _u32),
    ],
)
# BPF_PROG_ATTACH / BPF_PROG_DETACH
AttachAttr = _padded(
    "AttachAttr",
    [
        ("target_fd", _u32),
        ("attach_bpf_fd", _u32),
        ("attach_type", _u32),
        ("attach_flags", _u32),
        ("replace_bpf_fd", _u32),
    ],
)
# BPF_*_GET_NEXT_ID and BPF_*_GET_FD_BY_ID
IdAttr = _padded("IdAttr", [("id", _u32), ("next_id", _u32), ("open_flags", _u32)])
# BPF_OBJ_GET_INFO_BY_FD
InfoAttr = _padded("InfoAttr", [("bpf_fd", _u32), ("info_len", _u32), ("info", _u64)])
# BPF_PROG_QUERY
QueryAttr = _padded(
    "QueryAttr",
    [
        ("target_fd", _u32),
        ("attach_type", _u32),
        ("query_flags", _u32),
        ("attach_flags", _u32),
        ("prog_ids", _u64),
        ("prog_cnt", _u32),
    ],
)


class ProgInfoStruct(ctypes.Structure):
    """struct bpf_prog_info, up to `name`; the rest stays zero."""

    _fields_ = [
        ("type", _u32),
        ("id", _u32),
        ("tag", ctypes.c_uint8 * 8),
        ("jited_prog_len", _u32),
        ("xlated_prog_len", _u32),
        ("jited_prog_insns", _u64),
        ("xlated_prog_insns", _u64),
        ("load_time", _u64),
        ("created_by_uid", _u32),
        ("nr_map_ids", _u32),
        ("map_ids", _u64),
        ("name", ctypes.c_char * 16),
    ]


class MapInfoStruct(ctypes.Structure):
    """struct bpf_map_info, up to `name`."""

    _fields_ = [
        ("type", _u32),
        ("id", _u32),
        ("key_size", _u32),
        ("value_size", _u32),
        ("max_entries", _u32),
        ("map_flags", _u32),
        ("name", ctypes.c_char * 16),
    ]


# The process's own symbols, libc among them: find_library("c") would run ldconfig at import.
_libc = ctypes.CDLL(None, use_errno=True)
_NR_BPF = SYS_BPF.get(platform.machine())


def _bpf(cmd: int, attr: ctypes.Structure, what: str) -> int:
    if _NR_BPF is None:
        raise BpfError(f"bpf() is not wired for {platform.machine()}")
    result = _libc.syscall(_NR_BPF, cmd, ctypes.byref(attr), ctypes.sizeof(attr))
    if result < 0:
        err = ctypes.get_errno()
        raise BpfError(f"{what}: {os.strerror(err)}") from OSError(err, os.strerror(err))
    return int(result)


def errno_of(exc: BaseException) -> int | None:
    cause = exc.__cause__
    return cause.errno if isinstance(cause, OSError) else None


def map_create(key_size: int, value_size: int, max_entries: int, name: str) -> int:
    attr = MapCreateAttr(
        map_type=BPF_MAP_TYPE_HASH,
        key_size=key_size,
        value_size=value_size,
        max_entries=max_entries,
        map_name=name.encode()[:15],
    )
    return _bpf(BPF_MAP_CREATE, attr, "creating a map")


def map_update(fd: int, key: bytes, value: bytes) -> None:
    k, v = (
        ctypes.create_string_buffer(key, len(key)),
        ctypes.create_string_buffer(value, len(value)),
    )
    attr = MapElemAttr(map_fd=fd, key=ctypes.addressof(k), value=ctypes.addressof(v), flags=BPF_ANY)
    _bpf(BPF_MAP_UPDATE_ELEM, attr, "updating a map")


def map_delete(fd: int, key: bytes) -> bool:
    """False when the key was not there."""
    k = ctypes.create_string_buffer(key, len(key))
    try:
        _bpf(BPF_MAP_DELETE_ELEM, MapElemAttr(map_fd=fd, key=ctypes.addressof(k)), "deleting")
    except BpfError as exc:
        if errno_of(exc) == errno.ENOENT:
            return False
        raise
    return True


def map_lookup(fd: int, key: bytes, value_size: int) -> bytes | None:
    k, v = ctypes.create_string_buffer(key, len(key)), ctypes.create_string_buffer(value_size)
    attr = MapElemAttr(map_fd=fd, key=ctypes.addressof(k), value=ctypes.addressof(v))
    try:
        _bpf(BPF_MAP_LOOKUP_ELEM, attr, "looking up")
    except BpfError as exc:
        if errno_of(exc) == errno.ENOENT:
            return None
        raise
    return v.raw


def map_keys(fd: int, key_size: int) -> list[bytes]:
    keys: list[bytes] = []
    nxt = ctypes.create_string_buffer(key_size)
    current: ctypes.Array[ctypes.c_char] | None = None
    while True:
        attr = MapElemAttr(
            map_fd=fd,
            key=ctypes.addressof(current) if current is not None else 0,
            value=ctypes.addressof(nxt),
        )
        try:
            _bpf(BPF_MAP_GET_NEXT_KEY, attr, "iterating a map")
        except BpfError as exc:
            if errno_of(exc) == errno.ENOENT:
                return keys
            raise
        keys.append(nxt.raw)
        current = ctypes.create_string_buffer(nxt.raw, key_size)


def prog_load(insns: bytes, name: str, license_: str = "GPL") -> int:
    buf = ctypes.create_string_buffer(insns, len(insns))
    lic = ctypes.create_string_buffer(license_.encode())

    def attempt(log_size: int) -> tuple[int, str]:
        log = ctypes.create_string_buffer(log_size) if log_size else None
        attr = ProgLoadAttr(
            prog_type=BPF_PROG_TYPE_CGROUP_DEVICE,
            insn_cnt=len(insns) // 8,
            insns=ctypes.addressof(buf),
            license=ctypes.addressof(lic),
            log_level=1 if log_size else 0,
            log_size=log_size,
            log_buf=ctypes.addressof(log) if log is not None else 0,
            prog_name=name.encode()[:15],
            expected_attach_type=BPF_CGROUP_DEVICE,
        )
        try:
            return _bpf(BPF_PROG_LOAD, attr, "loading the device program"), ""
        except BpfError:
            if log is None:
                raise
            return -1, log.value.decode(errors="replace")

    try:
        return attempt(0)[0]
    except BpfError as first:
        fd, log = attempt(1 << 20)
        if fd >= 0:
            return fd
        raise BpfError(f"{first.message}; verifier log:\n{log[-4000:]}") from first.__cause__


def prog_attach(cgroup_fd: int, prog_fd: int, flags: int, replace_fd: int = 0) -> None:
    attr = AttachAttr(
        target_fd=cgroup_fd,
        attach_bpf_fd=prog_fd,
        attach_type=BPF_CGROUP_DEVICE,
        attach_flags=flags,
        replace_bpf_fd=replace_fd,
    )
    _bpf(BPF_PROG_ATTACH, attr, "attaching the device program")


def prog_detach(cgroup_fd: int, prog_fd: int) -> None:
    attr = AttachAttr(target_fd=cgroup_fd, attach_bpf_fd=prog_fd, attach_type=BPF_CGROUP_DEVICE)
    _bpf(BPF_PROG_DETACH, attr, "detaching a device program")


def prog_query(cgroup_fd: int) -> tuple[int, list[int]]:
    """(attach flags, IDs of the device programs attached to this very cgroup)."""
    ids = (_u32 * 64)()
    attr = QueryAttr(
        target_fd=cgroup_fd,
        attach_type=BPF_CGROUP_DEVICE,
        prog_ids=ctypes.addressof(ids),
        prog_cnt=len(ids),
    )
    _bpf(BPF_PROG_QUERY, attr, "querying the cgroup's device programs")
    return int(attr.attach_flags), [int(ids[i]) for i in range(attr.prog_cnt)]


def prog_fd_by_id(prog_id: int) -> int:
    return _bpf(BPF_PROG_GET_FD_BY_ID, IdAttr(id=prog_id), f"opening program {prog_id}")


def map_fd_by_id(map_id: int) -> int:
    return _bpf(BPF_MAP_GET_FD_BY_ID, IdAttr(id=map_id), f"opening map {map_id}")


@dataclass(frozen=True)
class ProgInfo:
    id: int
    name: str
    map_ids: list[int]
    xlated: bytes


_FEW_MAPS = 8


def prog_info(fd: int, with_insns: bool = True) -> ProgInfo:
    """The program's name, maps and (`with_insns`) its translated instructions.

    Without instructions one call answers the usual case (a few maps): telling our
    wrappers from foreign programs needs only the name and the map IDs.
    """
    if not with_insns:
        few = (_u32 * _FEW_MAPS)()
        info = ProgInfoStruct(nr_map_ids=_FEW_MAPS, map_ids=ctypes.addressof(few))
        _get_info(fd, info)
        if info.nr_map_ids <= _FEW_MAPS:
            ids = [int(few[i]) for i in range(info.nr_map_ids)]
            return ProgInfo(int(info.id), info.name.decode(errors="replace"), ids, b"")
    info = ProgInfoStruct()
    _get_info(fd, info)
    insns = ctypes.create_string_buffer(info.xlated_prog_len)
    map_ids = (_u32 * max(info.nr_map_ids, 1))()
    full = ProgInfoStruct(
        xlated_prog_len=info.xlated_prog_len,
        xlated_prog_insns=ctypes.addressof(insns),
        nr_map_ids=info.nr_map_ids,
        map_ids=ctypes.addressof(map_ids),
    )
    _get_info(fd, full)
    return ProgInfo(
        id=int(full.id),
        name=full.name.decode(errors="replace"),
        map_ids=[int(map_ids[i]) for i in range(min(full.nr_map_ids, info.nr_map_ids))],
        xlated=insns.raw[: full.xlated_prog_len],
    )


@dataclass(frozen=True)
class MapInfo:
    id: int
    name: str
    key_size: int
    value_size: int


def map_info(fd: int) -> MapInfo:
    info = MapInfoStruct()
    _get_info(fd, info)
    return MapInfo(int(info.id), info.name.decode(errors="replace"), info.key_size, info.value_size)


def _get_info(fd: int, info: ctypes.Structure) -> None:
    attr = InfoAttr(bpf_fd=fd, info_len=ctypes.sizeof(info), info=ctypes.addressof(info))
    _bpf(BPF_OBJ_GET_INFO_BY_FD, attr, "reading object info")


def _all_ids(cmd: int) -> list[int]:
    ids: list[int] = []
    current = 0
    while True:
        attr = IdAttr(id=current)
        try:
            _bpf(cmd, attr, "listing ids")
        except BpfError as exc:
            if errno_of(exc) == errno.ENOENT:
                return ids
            raise
        current = int(attr.next_id)
        ids.append(current)


def all_prog_ids() -> list[int]:
    return _all_ids(BPF_PROG_GET_NEXT_ID)


def all_map_ids() -> list[int]:
    return _all_ids(BPF_MAP_GET_NEXT_ID)
