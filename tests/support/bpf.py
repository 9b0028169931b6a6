"""Drift on cgroup v2, as systemd or a runtime causes it, made with raw bpf() calls.

`attach_foreign` loads a copy of the runtime's own program (read from the
cgroup before the engine wrapped it: the verifier inlines the map lookup in a
wrapper's dump, so it cannot be sliced back out) and attaches it beside our
wrapper (systemd re-applying its policy) or in its place (a runtime re-attaching).
"""

from __future__ import annotations

import os
from pathlib import Path

from hotmount.cgroups import bpf_sys, prologue


def attached(cgroup_dir: Path) -> list[bpf_sys.ProgInfo]:
    fd = os.open(cgroup_dir, os.O_RDONLY | os.O_DIRECTORY)
    try:
        _, ids = bpf_sys.prog_query(fd)
        infos = []
        for prog_id in ids:
            prog_fd = bpf_sys.prog_fd_by_id(prog_id)
            try:
                infos.append(bpf_sys.prog_info(prog_fd))
            finally:
                os.close(prog_fd)
        return infos
    finally:
        os.close(fd)


def attach_foreign(cgroup_dir: Path, program: bytes, replace_ours: bool) -> None:
    prog_fd = bpf_sys.prog_load(program, "sd_devices")
    cgroup_fd = os.open(cgroup_dir, os.O_RDONLY | os.O_DIRECTORY)
    try:
        if replace_ours:
            ours = next(p for p in attached(cgroup_dir) if p.name == prologue.WRAPPER_NAME)
            ours_fd = bpf_sys.prog_fd_by_id(ours.id)
            try:
                flags = bpf_sys.BPF_F_ALLOW_MULTI | bpf_sys.BPF_F_REPLACE
                bpf_sys.prog_attach(cgroup_fd, prog_fd, flags, ours_fd)
            finally:
                os.close(ours_fd)
        else:
            bpf_sys.prog_attach(cgroup_fd, prog_fd, bpf_sys.BPF_F_ALLOW_MULTI)
    finally:
        os.close(cgroup_fd)
        os.close(prog_fd)


def object_counts() -> tuple[int, int]:
    """(programs, maps) this process holds open: where a leak of the in-process engine
    stays (it pins nothing in bpffs; what it leaves attached, `attached` counts). Not the
    whole kernel's: other processes on the machine load and free their own meanwhile."""
    programs, maps = set(), set()
    for fd in os.listdir("/proc/self/fdinfo"):
        try:
            info = Path("/proc/self/fdinfo", fd).read_text()
        except OSError:  # closed meanwhile (the listing's own fd among them)
            continue
        for line in info.splitlines():
            key, _, value = line.partition(":")
            if key == "prog_id":
                programs.add(int(value))
            elif key == "map_id":
                maps.add(int(value))
    return len(programs), len(maps)
