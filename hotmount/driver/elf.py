"""DT_SONAME of an ELF64 little-endian shared library, read from bytes (pure).

The agent reads it from the *host's* driver files to name the soname symlink
(`libcuda.so.1 -> libcuda.so.550.54.15`) that ldconfig would have made, without
running ldconfig anywhere.
"""

from __future__ import annotations

import struct

_PT_DYNAMIC = 2
_DT_NULL, _DT_STRTAB, _DT_SONAME = 0, 5, 14
_PT_LOAD = 1


def soname(data: bytes) -> str | None:
    """The library's DT_SONAME, or None (not ELF64 LE, no dynamic section, no soname)."""
    if len(data) < 64 or data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        return None
    (phoff,) = struct.unpack_from("<Q", data, 32)
    phentsize, phnum = struct.unpack_from("<HH", data, 54)
    loads: list[tuple[int, int, int]] = []  # (vaddr, offset, filesz)
    dynamic: tuple[int, int] | None = None
    for i in range(phnum):
        at = phoff + i * phentsize
        if at + 56 > len(data):
            return None
        p_type, _, p_offset, p_vaddr, _, p_filesz = struct.unpack_from("<IIQQQQ", data, at)
        if p_type == _PT_LOAD:
            loads.append((p_vaddr, p_offset, p_filesz))
        elif p_type == _PT_DYNAMIC:
            dynamic = (p_offset, p_filesz)
    if dynamic is None:
        return None
    strtab = name_at = None
    offset, size = dynamic
    for at in range(offset, min(offset + size, len(data) - 15), 16):
        tag, value = struct.unpack_from("<qQ", data, at)
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
            start = file_offset + (strtab - vaddr) + name_at
            end = data.find(b"\0", start)
            if start >= len(data) or end < 0:
                return None
            return data[start:end].decode("ascii", "replace") or None
    return None
