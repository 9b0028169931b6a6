"""A mount's line found in a mountinfo read only as far as it (hotmount/tenantfs/mounts.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hotmount.tenantfs.mounts import Mount, MountTable, mount_of

LOWER = ":".join(f"/var/lib/containerd/snapshots/{n}/fs" for n in range(60))  # > 1 KiB
MOUNTINFO = (
    f"193 110 0:50 / / rw,relatime - overlay overlay rw,lowerdir={LOWER},upperdir=/u\n"
    "194 193 0:68 / /proc rw,relatime - proc proc rw\n"
    "195 193 0:69 / /dev rw,nosuid - tmpfs tmpfs rw,size=65536k,mode=755\n"
    "1950 193 0:90 / /mnt/share rw,nodev shared:7 master:3 - nfs4 srv:/x rw\n"
    "19 195 0:91 / /dev/infiniband rw - fuse hung rw,user_id=0"  # no newline at the end
)


@pytest.fixture
def mountinfo(tmp_path: Path) -> str:
    path = tmp_path / "mountinfo"
    path.write_text(MOUNTINFO)
    return str(path)


@pytest.mark.parametrize(
    ("mnt_id", "expected"),
    [
        (193, Mount("overlay", False)),
        (195, Mount("tmpfs", False)),  # its line starts past the first read
        (1950, Mount("nfs4", True)),  # optional tags before the separator
        (19, Mount("fuse", False)),  # the last line, unterminated; "19" is no prefix match
        (95, None),
        (None, None),
    ],
    ids=["root", "dev", "tags", "last-line", "absent", "unknown"],
)
def test_one_mount_is_found_as_the_whole_table_finds_it(
    mountinfo: str, mnt_id: int | None, expected: Mount | None
) -> None:
    assert mount_of(mountinfo, mnt_id) == expected
    assert MountTable(mountinfo).get(mnt_id) == expected


def test_an_unreadable_mountinfo_finds_nothing(tmp_path: Path) -> None:
    assert mount_of(str(tmp_path / "gone"), 195) is None
