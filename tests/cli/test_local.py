"""`nvcli --local` on real runc containers (v1 and v2): the engine in nvcli's own process.

Stand-in devices as in tests/kernel: `nvidia.com/gpu=1` is /dev/fuse's 10:229,
so it opens once granted and a container process can hold it open.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.cli.conftest import Run
from tests.support.fixtures import STAND_IN_SPEC
from tests.support.runc import RuncContainer, make_rootfs, missing_requirements

WHY_NOT = missing_requirements()
pytestmark = [
    pytest.mark.kernel,
    pytest.mark.skipif(WHY_NOT is not None, reason=f"kernel test: {WHY_NOT}"),
]
Nvcli = Callable[..., Run]

SPEC = STAND_IN_SPEC
GPU1 = "nvidia.com/gpu=1"


@pytest.fixture(scope="module")
def rootfs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_rootfs(tmp_path_factory.mktemp("rootfs"))


@pytest.fixture
def engine_flags(tmp_path: Path) -> list[str]:
    cdi = tmp_path / "cdi"
    cdi.mkdir()
    (cdi / "stand-in.yaml").write_text(SPEC)
    return ["--local", "--cdi-dir", str(cdi), "--state-dir", str(tmp_path / "state")]


@pytest.fixture(params=["v1", "v2"])
def make(request: pytest.FixtureRequest, tmp_path: Path, rootfs: Path) -> Iterator:
    made: list[RuncContainer] = []

    def start() -> RuncContainer:
        made.append(RuncContainer(tmp_path, rootfs, request.param))
        return made[-1]

    yield start
    for container in made:
        container.stop()


def test_mount_status_list_busy_force_unmount(
    nvcli: Nvcli, engine_flags: list[str], make: Callable[[], RuncContainer]
) -> None:
    container = make()
    cid = container.id

    listing = nvcli("list", *engine_flags, "-o", "json")
    assert listing.rc == 0, listing.err
    assert {"nvidia.com/gpu=0", GPU1} <= {d["key"] for d in json.loads(listing.out)[0]["devices"]}

    mounted = nvcli("mount", "--container", cid, "--mount", GPU1, *engine_flags, "-o", "json")
    assert mounted.rc == 0, mounted.err
    assert [d["key"] for d in json.loads(mounted.out)["mounted"]] == [GPU1]
    assert container.open_result("/dev/nvidia1") == "OK"

    status = nvcli("status", "--container", cid, *engine_flags, "-o", "yaml")
    assert status.rc == 0 and GPU1 in status.out and "/dev/nvidia1" in status.out
    table = nvcli("list", *engine_flags)
    assert cid[:13] in table.out

    holder = container.hold("/dev/nvidia1")
    try:
        busy = nvcli("unmount", "--container", cid, "--unmount", GPU1, *engine_flags)
        assert busy.rc == 3, busy.err
        assert "is in use by PID" in busy.err and "retry with --force" in busy.err
        assert container.open_result("/dev/nvidia1") == "OK"

        forced = nvcli("unmount", "--container", cid, "--unmount", GPU1, "--force",
                       *engine_flags, "-o", "json")  # fmt: skip
        assert forced.rc == 0, forced.err
        assert json.loads(forced.out)["stoppedPids"]
    finally:
        holder.kill()
        holder.communicate()
    assert "nvidia1" not in container.ls_dev()


def test_move_between_containers(
    nvcli: Nvcli, engine_flags: list[str], make: Callable[[], RuncContainer]
) -> None:
    a, b = make(), make()
    assert nvcli("mount", "--container", a.id, "--mount", GPU1, *engine_flags).rc == 0
    moved = nvcli("move", "--gpu", GPU1, "--from", a.id, "--to", b.id, *engine_flags)
    assert moved.rc == 0, moved.err
    assert "nvidia1" not in a.ls_dev()
    assert b.open_result("/dev/nvidia1") == "OK"


def test_local_errors(
    nvcli: Nvcli, engine_flags: list[str], make: Callable[[], RuncContainer]
) -> None:
    container = make()
    missing = nvcli("mount", "--container", container.id, "--mount", "nvidia.com/gpu=9",
                    *engine_flags)  # fmt: skip
    assert missing.rc == 4, missing.err
    block = nvcli("mount", "--container", container.id, "--mount", "nvidia.com/gpu=disk",
                  *engine_flags)  # fmt: skip
    assert block.rc == 2, block.err
    gone = nvcli("status", "--container", "f" * 64, *engine_flags)
    assert gone.rc == 4, gone.err


def test_local_errors_are_the_agents_status(
    engine_flags: list[str], make: Callable[[], RuncContainer]
) -> None:
    """`--local` maps an engine error as the agent does (hotmount/wire/results.py): a GPU
    hot-mounted in another container is refused with its owner *and* its holders, which
    `--local` left out before the two shared one mapping; the exit code is a conflict's."""
    from agent.errors import status_of
    from cli.local import LocalEngine
    from cli.options import Common
    from hotmount.errors import DeviceClaimed
    from hotmount.wire.errors import EXIT_CONFLICT, Conflict

    flags = dict(zip(engine_flags[1::2], engine_flags[2::2], strict=True))
    opts = Common(local=True, cdi_dir=[flags["--cdi-dir"]], state_dir=Path(flags["--state-dir"]))
    a, b = make(), make()
    local = LocalEngine(opts)
    assert [d.key for d in local.mount(a.id, [GPU1], force=False).mounted] == [GPU1]
    with pytest.raises(Conflict) as refused:
        local.mount(b.id, [GPU1], force=False)
    engine_error = refused.value.__cause__
    assert isinstance(engine_error, DeviceClaimed)
    assert refused.value.status == status_of(engine_error)
    assert refused.value.exit_code == EXIT_CONFLICT
    assert refused.value.details["owner"] == a.id
    assert [(h["containerId"], h["device"]) for h in refused.value.details["holders"]] == [
        (a.id, GPU1)
    ]
