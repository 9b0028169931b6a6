"""A process's PID in the container's PID namespace (hotmount/host/liveness.py `pid_in`): what
a suspend's result names, read from a fixture /proc (`ns/pid` links, `NSpid` lines)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hotmount.errors import ContainerNotFound
from hotmount.host import liveness

CONTAINER_NS, NESTED_NS, HOST_NS = "pid:[4026532301]", "pid:[4026532377]", "pid:[4026531836]"


def process(proc: Path, pid: int, namespace: str, nspid: list[int]) -> None:
    (proc / str(pid) / "ns").mkdir(parents=True)
    (proc / str(pid) / "ns" / "pid").symlink_to(namespace)  # read as a link, never followed
    ids = "\t".join(str(n) for n in nspid)
    (proc / str(pid) / "status").write_text(f"Name:\tpython\nPid:\t{pid}\nNSpid:\t{ids}\n")


@pytest.mark.parametrize(
    ("namespace", "nspid", "expected"),
    [
        (CONTAINER_NS, [48213, 7], 7),
        (NESTED_NS, [48214, 8, 1], None),  # a namespace nested in the container's
        (HOST_NS, [48215], None),  # a host process put into the container's cgroup
    ],
    ids=["the-containers", "nested", "the-hosts"],
)
def test_a_process_is_named_by_its_pid_in_the_container_or_not_at_all(
    tmp_path: Path, namespace: str, nspid: list[int], expected: int | None
) -> None:
    process(tmp_path, nspid[0], namespace, nspid)
    process(tmp_path, 48000, CONTAINER_NS, [48000, 1])  # the container's init
    own = liveness.pid_namespace(str(tmp_path), 48000)
    assert liveness.pid_in(str(tmp_path), nspid[0], own) == expected


def test_a_process_gone_is_container_not_found(tmp_path: Path) -> None:
    with pytest.raises(ContainerNotFound):
        liveness.pid_in(str(tmp_path), 4242, CONTAINER_NS)
