"""cgroup v1 `devices` controller: read the list, allow, deny, and check the result.

`allows()` is a pure emulation of the kernel's list check, so that the engine
can tell a grant the runtime already made (never recorded, never revoked) from
one it must add. After every write the list is read back: the kernel, not the
write's return code, is the proof.
"""

from __future__ import annotations

import errno
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
    return entries


def allows(entries: list[ListEntry], rule: DeviceRule) -> bool:
    return any(entry.covers(rule) for entry in entries)


class V1Devices:
    """The `devices` cgroup of one container."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def entries(self) -> list[ListEntry]:
        try:
            return parse_list((self.directory / "devices.list").read_text())
        except FileNotFoundError as exc:
            raise ContainerNotFound(f"cgroup {self.directory} is gone") from exc

    def allows(self, rule: DeviceRule) -> bool:
        return allows(self.entries(), rule)

    def allow(self, rule: DeviceRule) -> None:
        self._write("devices.allow", rule)
        if not self.allows(rule):
            raise KernelError(f"{self.directory}: wrote '{rule.v1_line()}' but the list lacks it")

    def deny(self, rule: DeviceRule) -> None:
        self._write("devices.deny", rule)

    def _write(self, name: str, rule: DeviceRule) -> None:
        path = self.directory / name
        try:
            fd = os.open(path, os.O_WRONLY)
        except FileNotFoundError as exc:
            raise ContainerNotFound(f"cgroup {self.directory} is gone") from exc
        try:
            os.write(fd, rule.v1_line().encode())
        except OSError as exc:
            hint = " (the parent cgroup does not allow it)" if exc.errno == errno.EPERM else ""
            line = rule.v1_line()
            raise KernelError(f"writing '{line}' to {path}: {exc.strerror}{hint}") from exc
        finally:
            os.close(fd)
