"""DT_SONAME of an ELF64 little-endian shared library (pure: reads through a callable).

The agent reads it from the *host's* driver files to name the soname symlink
(`libcuda.so.1 -> libcuda.so.550.54.15`) that ldconfig would have made, without
running ldconfig anywhere. The dynamic section sits in the library's writable segment,
after its code: 90 MiB into a real libcuda.so, so the reads go where the program
headers point rather than through a prefix of the file.
"""

from __future__ import annotations

import struct
from collections.abc import Callable

Read = Callable[[int, int], bytes]
"""`read(offset, size)`: at most `size` bytes of the file from `offset` (os.pread's order
swapped), fewer at its end."""

_PT_DYNAMIC = 2
_DT_NULL, _DT_STRTAB, _DT_SONAME = 0, 5, 14
_PT_LOAD = 1
_MAX_PROGRAM_HEADERS = 256
_MAX_DYNAMIC = 64 << 10  # entries past this many bytes are not a soname's
_MAX_NAME = 4096


def soname(read: Read) -> str | None:
    """The library's DT_SONAME, or None (not ELF64 LE, no dynamic section, no soname)."""
    head = read(0, 64)
    if len(head) < 64 or head[:4] != b"\x7fELF" or head[4] != 2 or head[5] != 1:
        return None
    (phoff,) = struct.unpack_from("<Q", head, 32)
    phentsize, phnum = struct.unpack_from("<HH", head, 54)
    if phentsize < 56 or phnum > _MAX_PROGRAM_HEADERS:
        return None
    headers = read(phoff, phentsize * phnum)
    loads: list[tuple[int, int, int]] = []  # (vaddr, offset, filesz)
    dynamic: tuple[int, int] | None = None
    for at in range(0, phentsize * phnum, phentsize):
        if at + 56 > len(headers):
            return None
        p_type, _, p_offset, p_vaddr, _, p_filesz = struct.unpack_from("<IIQQQQ", headers, at)
        if p_type == _PT_LOAD:
            loads.append((p_vaddr, p_offset, p_filesz))
        elif p_type == _PT_DYNAMIC:
            dynamic = (p_offset, p_filesz)
    if dynamic is None:
        return None
    entries = read(dynamic[0], min(dynamic[1], _MAX_DYNAMIC))
    strtab = name_at = None
    for at in range(0, len(entries) - 15, 16):
        tag, value = struct.unpack_from("<qQ", entries, at)
        if tag == _DT_NULL:
            break
        if tag == _DT_STRTAB:
            strtab = value
        elif tag == _DT_SONAME:
            name_at = value
    if strtab is None or name_at is None:
        return None
    for vaddr, file_offset, filesz in loads:  # DT_STRTAB is an address: map it to the file
        if vaddr <= strtab < vaddr + filesz:
            name = read(file_offset + (strtab - vaddr) + name_at, _MAX_NAME)
            end = name.find(b"\0")
            return name[:end].decode("ascii", "replace") if end > 0 else None
    return None


def soname_of_bytes(data: bytes) -> str | None:
    """`soname` of a whole file held in memory."""
    return soname(lambda offset, size: data[offset : offset + size])
