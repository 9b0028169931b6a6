"""cgroup v1 `devices` controller: read the list, allow, deny, and check the result.

`allows()` is a pure emulation of the kernel's list check, so that the engine
can tell a grant the runtime already made (never recorded, never revoked) from
one it must add. After every write the list is read back: the kernel, not the
write's return code, is the proof.
"""

from __future__ import annotations

import errno
import functools
import os
from dataclasses import dataclass
from pathlib import Path

from hotmount.devices.model import DeviceRule, access_mask
from hotmount.errors import ContainerNotFound, KernelError


@dataclass(frozen=True)
class ListEntry:
    """One `devices.list` line; major/minor None means `*`."""

    type: str
    major: int | None
    minor: int | None
    access: int

    def covers(self, rule: DeviceRule) -> bool:
        return (
            self.type in ("a", rule.type)
            and self.major in (None, rule.major)
            and self.minor in (None, rule.minor)
            and self.access & rule.access == rule.access
        )


def parse_list(text: str) -> list[ListEntry]:
    return list(_parse_list(text))


@functools.lru_cache(maxsize=1024)
def _parse_list(text: str) -> tuple[ListEntry, ...]:
    """Pure and cached: a container's list reads the same from one mount to the next."""
    entries = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) != 3:
            continue
        kind, numbers, access = parts
        major, _, minor = numbers.partition(":")
        entries.append(
            ListEntry(
                kind,
                None if major == "*" else int(major),
                None if minor == "*" else int(minor),
                access_mask(access),
            )
        )
    return tuple(entries)


def allows(entries: list[ListEntry] | tuple[ListEntry, ...], rule: DeviceRule) -> bool:
    return any(entry.covers(rule) for entry in entries)


class V1Devices:
    """The `devices` cgroup of one container."""

    def __init__(self, directory: Path | str) -> None:
        self.directory = directory

    def entries(self) -> tuple[ListEntry, ...]:
        path = f"{self.directory}/devices.list"
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError as exc:
            raise ContainerNotFound(f"cgroup {self.directory} is gone") from exc
        try:
            chunks = []
            while chunk := os.read(fd, 65536):
                chunks.append(chunk)
        finally:
            os.close(fd)
        return _parse_list(b"".join(chunks).decode())

    def allows(self, rule: DeviceRule) -> bool:
        return allows(self.entries(), rule)

    def allow(self, rule: DeviceRule) -> None:
        self.allow_all([rule])

    def allow_all(self, rules: list[DeviceRule]) -> None:
        """Write every rule, then read the list back once: the kernel is the proof."""
        if not rules:
            return
        self._write("devices.allow", rules)
        entries = self.entries()
        for rule in rules:
            if not allows(entries, rule):
                line = rule.v1_line()
                raise KernelError(f"{self.directory}: wrote '{line}' but the list lacks it")

    def deny(self, rule: DeviceRule) -> None:
        self.deny_all([rule])

    def deny_all(self, rules: list[DeviceRule]) -> None:
        if rules:
            self._write("devices.deny", rules)

    def _write(self, name: str, rules: list[DeviceRule]) -> None:
        """One open, one write(2) per line: the kernel takes one rule per write."""
        path = f"{self.directory}/{name}"
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
        except FileNotFoundError as exc:
            raise ContainerNotFound(f"cgroup {self.directory} is gone") from exc
        try:
            for rule in rules:
                line = rule.v1_line()
                try:
                    os.write(fd, line.encode())
                except OSError as exc:
                    eperm = exc.errno == errno.EPERM
                    why = " (the parent cgroup does not allow it)" if eperm else ""
                    raise KernelError(f"writing '{line}' to {path}: {exc.strerror}{why}") from exc
        finally:
            os.close(fd)
