"""cgroup v2 device control: wrap every attached program once, then grant with map updates.

The state lives in the kernel: our wrappers are found by program name on the
cgroup, and their map through the program's `map_ids`. A fresh process (the
agent after a restart, or `python -m hotmount`) therefore needs no memory of
what an earlier one did. A program that is not ours (the runtime re-attached,
systemd re-applied its policy after a daemon-reload) is wrapped too, sharing
the map, so every effective program lets the granted devices through.
"""

from __future__ import annotations

import errno
import os
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

from hotmount.cgroups import bpf_asm, bpf_sys, prologue
from hotmount.devices.model import DeviceRule
from hotmount.errors import BpfError, ContainerNotFound

_REPLACE_RETRIES = 3


@dataclass(frozen=True)
class Attached:
    id: int
    fd: int
    info: bpf_sys.ProgInfo

    @property
    def ours(self) -> bool:
        return self.info.name == prologue.WRAPPER_NAME and len(self.info.map_ids) == 1


@dataclass(frozen=True)
class V2State:
    restricted: bool  # any device program attached at all
    wrapped: int
    foreign: int
    grants: frozenset[DeviceRule]


class V2Devices:
    """The BPF device programs of one cgroup v2 directory."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def grant(self, rules: list[DeviceRule]) -> int:
        """Wrap what is not wrapped yet and put the rules in the map; return wraps done."""
        with ExitStack() as stack:
            cgroup_fd = self._open(stack)
            for _ in range(_REPLACE_RETRIES):
                flags, attached = self._attached(stack, cgroup_fd)
                if not attached:
                    return 0  # no program: v2 restricts nothing here
                try:
                    wraps = self._wrap_foreign(stack, cgroup_fd, flags, attached)
                except _Raced:
                    continue
                break
            else:
                raise BpfError(f"{self.directory}: its device programs kept changing")
            if wraps:  # look again: the wrappers replaced what was there
                _, attached = self._attached(stack, cgroup_fd)
            map_fds = self._map_fds(stack, attached)
            if not map_fds or any(not a.ours for a in attached):
                raise BpfError(f"{self.directory}: a device program is still unwrapped")
            for map_fd in map_fds:
                for rule in rules:
                    bpf_sys.map_update(map_fd, prologue.map_key(rule), prologue.map_value(rule))
            return wraps

    def revoke(self, rules: list[DeviceRule]) -> None:
        with ExitStack() as stack:
            cgroup_fd = self._open(stack)
            _, attached = self._attached(stack, cgroup_fd)
            for map_fd in self._map_fds(stack, attached):
                for rule in rules:
                    bpf_sys.map_delete(map_fd, prologue.map_key(rule))

    def state(self) -> V2State:
        with ExitStack() as stack:
            cgroup_fd = self._open(stack)
            _, attached = self._attached(stack, cgroup_fd)
            grants: set[DeviceRule] = set()
            for map_fd in self._map_fds(stack, attached):
                for key in bpf_sys.map_keys(map_fd, prologue.KEY_SIZE):
                    value = bpf_sys.map_lookup(map_fd, key, prologue.VALUE_SIZE)
                    if value is not None:
                        grants.add(prologue.rule_from_entry(key, value))
            wrapped = sum(a.ours for a in attached)
            return V2State(bool(attached), wrapped, len(attached) - wrapped, frozenset(grants))

    def _open(self, stack: ExitStack) -> int:
        try:
            fd = os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except FileNotFoundError as exc:
            raise ContainerNotFound(f"cgroup {self.directory} is gone") from exc
        stack.callback(os.close, fd)
        return fd

    def _attached(self, stack: ExitStack, cgroup_fd: int) -> tuple[int, list[Attached]]:
        flags, ids = bpf_sys.prog_query(cgroup_fd)
        attached = []
        for prog_id in ids:
            try:
                fd = bpf_sys.prog_fd_by_id(prog_id)
            except BpfError as exc:
                if bpf_sys.errno_of(exc) == errno.ENOENT:
                    continue  # detached and freed since the query
                raise
            stack.callback(os.close, fd)
            attached.append(Attached(prog_id, fd, bpf_sys.prog_info(fd, with_insns=False)))
        return flags, attached

    def _map_fds(self, stack: ExitStack, attached: list[Attached]) -> list[int]:
        fds = []
        for map_id in sorted({a.info.map_ids[0] for a in attached if a.ours}):
            fd = bpf_sys.map_fd_by_id(map_id)
            stack.callback(os.close, fd)
            fds.append(fd)
        return fds

    def _wrap_foreign(
        self, stack: ExitStack, cgroup_fd: int, flags: int, attached: list[Attached]
    ) -> int:
        foreign = [a for a in attached if not a.ours]
        if not foreign:
            return 0
        map_fds = self._map_fds(stack, attached)
        if map_fds:
            map_fd = map_fds[0]
        else:
            map_fd = bpf_sys.map_create(
                prologue.KEY_SIZE, prologue.VALUE_SIZE, prologue.MAP_MAX_ENTRIES, prologue.MAP_NAME
            )
            stack.callback(os.close, map_fd)
        for program in foreign:
            original = bpf_asm.decode(bpf_sys.prog_info(program.fd).xlated)
            wrapper = bpf_sys.prog_load(
                bpf_asm.encode(prologue.wrap(original, map_fd)), prologue.WRAPPER_NAME
            )
            stack.callback(os.close, wrapper)
            self._replace(cgroup_fd, flags, wrapper, program.fd)
        return len(foreign)

    def _replace(self, cgroup_fd: int, flags: int, wrapper_fd: int, original_fd: int) -> None:
        """Swap in the wrapper atomically; never detach first (that opens a window)."""
        if not flags & bpf_sys.BPF_F_ALLOW_MULTI:
            # Single-program mode: attaching replaces the program in place.
            bpf_sys.prog_attach(cgroup_fd, wrapper_fd, flags)
            return
        try:
            bpf_sys.prog_attach(
                cgroup_fd,
                wrapper_fd,
                bpf_sys.BPF_F_ALLOW_MULTI | bpf_sys.BPF_F_REPLACE,
                original_fd,
            )
        except BpfError as exc:
            code = bpf_sys.errno_of(exc)
            if code == errno.ENOENT:
                raise _Raced from exc  # the original went away under us: look again
            if code != errno.EINVAL:
                raise
            # Kernels before 5.6 lack BPF_F_REPLACE: attach beside, then detach.
            # Both programs deny what the original denies, so there is no window.
            bpf_sys.prog_attach(cgroup_fd, wrapper_fd, bpf_sys.BPF_F_ALLOW_MULTI)
            bpf_sys.prog_detach(cgroup_fd, original_fd)


class _Raced(Exception):
    """The cgroup's programs changed between the query and the replace."""
