"""The one-file nvcli: scripts/build-cli.sh's dist/nvcli.pyz, run by the system's python3.

Built once for this module (a wheel, then every dependency of `.[cli]` as pip installs
it for CPython 3.11 on this platform). The runs go to the fake API server and its stub
agent as nvcli's own tests do, with a private HOME so the cache is the test's own.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from cli import zipapp
from tests.cli.conftest import Cluster, Run
from tests.cli.stub_agent import GPUS
from tests.cli.test_aggregated import exec_kubeconfig

REPO = Path(__file__).resolve().parents[2]
SYSTEM_PYTHON = "/usr/bin/python3"

needs_system_python = pytest.mark.skipif(
    not Path(SYSTEM_PYTHON).exists(), reason=f"no system interpreter at {SYSTEM_PYTHON}"
)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """dist/ of scripts/build-cli.sh, built into a temporary directory."""
    out = tmp_path_factory.mktemp("dist")
    env = {**os.environ, "DIST": str(out), "PYTHON": SYSTEM_PYTHON}
    done = subprocess.run(["bash", "scripts/build-cli.sh"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=900, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    yield out
    shutil.rmtree(out, ignore_errors=True)


def run_pyz(
    pyz: Path, home: Path, *args: str, env: dict[str, str] | None = None, umask: int = 0o022
) -> Run:
    environment = {"PATH": os.environ["PATH"], "HOME": str(home), **(env or {})}
    done = subprocess.run([SYSTEM_PYTHON, str(pyz), *args], capture_output=True, text=True,
                          env=environment, timeout=300, check=False, umask=umask)  # fmt: skip
    return Run(done.returncode, done.stdout, done.stderr)


def writable_by_others(root: Path) -> list[str]:
    """Every directory and file under `root` (itself included) that group or others may
    write to."""
    found = [str(root)] if root.stat().st_mode & 0o022 else []
    for directory, dirs, files in os.walk(root):
        for name in [*dirs, *files]:
            if (Path(directory) / name).lstat().st_mode & 0o022:
                found.append(os.path.join(directory, name))
    return found


@pytest.fixture
def small_pyz(tmp_path: Path) -> Path:
    """A zipapp made by the real packer and bootstrap around a two-line `cli.main`: the
    unpacking, checked in a second, not in the minutes a full build takes."""
    from scripts.pack_zipapp import pack

    site = tmp_path / "site"
    (site / "cli" / "deeper").mkdir(parents=True)
    (site / "cli" / "__init__.py").write_text("")
    (site / "cli" / "deeper" / "__init__.py").write_text("")
    (site / "cli" / "main.py").write_text("def main():\n    print('small nvcli')\n    return 0\n")
    pack(site, tmp_path / "small.pyz", "/usr/bin/env python3")
    return tmp_path / "small.pyz"


@needs_system_python
def test_under_umask_002_the_cache_is_private_and_used_run_after_run(
    small_pyz: Path, tmp_path: Path
) -> None:
    """Ubuntu's and Fedora's umask: each run refused the cache its first run had made,
    its directories group-writable."""
    cache = tmp_path / "cache"
    for _ in range(2):
        ran = run_pyz(small_pyz, tmp_path, env={"NVCLI_CACHE_DIR": str(cache)}, umask=0o002)
        assert (ran.rc, ran.out, ran.err) == (0, "small nvcli\n", "")
    assert writable_by_others(cache) == []
    (unpacked,) = cache.iterdir()
    assert (unpacked / "site-packages" / "cli" / "deeper" / "__pycache__").is_dir()


@needs_system_python
def test_under_umask_002_a_cache_made_writable_by_others_is_still_refused(
    small_pyz: Path, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    first = run_pyz(small_pyz, tmp_path, env={"NVCLI_CACHE_DIR": str(cache)}, umask=0o002)
    assert first.rc == 0, first.err
    (unpacked,) = cache.iterdir()
    (unpacked / "site-packages").chmod(0o777)
    (unpacked / "site-packages" / "cli" / "main.py").write_text("raise SystemExit('planted')\n")
    refused = run_pyz(small_pyz, tmp_path, env={"NVCLI_CACHE_DIR": str(cache)}, umask=0o002)
    assert refused.rc == 1
    assert "writable by others" in refused.err and "planted" not in refused.err + refused.out


@needs_system_python
def test_the_zipapp_mounts_and_shows_status_through_the_api_server(
    built: Path, cluster: Cluster, tmp_path: Path
) -> None:
    pyz = built / "nvcli.pyz"
    config = cluster.kubeconfig("alice", namespace="ml", token="alice-token")
    home = tmp_path / "home"
    home.mkdir()

    mounted = run_pyz(pyz, home, "mount", "--name", "nb-0", "--mount", "0",
                      "--kubeconfig", str(config), "-o", "json")  # fmt: skip
    assert mounted.rc == 0, mounted.err
    assert mounted.json()["mounted"][0]["uuid"] == GPUS[0]["uuid"]

    status = run_pyz(pyz, home, "status", "--name", "nb-0", "--kubeconfig", str(config))
    assert status.rc == 0, status.err
    assert status.out.startswith("POD ") and "nb-0" in status.out  # the stub's status
    assert GPUS[1]["uuid"] in status.out
    # The kubernetes package, for an exec-plugin user, comes from the zipapp too.
    plugin = exec_kubeconfig(cluster, "alice-token")
    via_plugin = run_pyz(pyz, home, "status", "--name", "nb-0", "--kubeconfig", str(plugin))
    assert via_plugin.rc == 0, via_plugin.err
    assert [r.path for r in cluster.agent.received][-1].endswith("/gpumounts/nb-0")

    # Unpacked once, into the user's cache, for this interpreter's version only.
    (unpacked,) = (home / ".cache" / "nvcli").iterdir()
    assert unpacked.name.endswith(f"-py{sys.version_info[0]}{sys.version_info[1]}")
    assert (unpacked / zipapp.COMPLETE).is_file()


@needs_system_python
def test_the_zipapp_holds_no_agent_dependency_and_pydantic_core_for_each_python(
    built: Path,
) -> None:
    with zipfile.ZipFile(built / "nvcli.pyz") as outer:
        assert sorted(outer.namelist()) == ["__main__.py", "site-packages.zip"]
        with outer.open("site-packages.zip") as inner_file, zipfile.ZipFile(inner_file) as inner:
            tops = {name.split("/")[0] for name in inner.namelist()}
            cores = [n for n in inner.namelist() if n.startswith("pydantic_core/_pydantic_core.")]
    for agent_only in ("fastapi", "uvicorn", "pyroute2", "grpc", "prometheus_client"):
        assert agent_only not in tops
    assert {"cli", "typer", "kubernetes", "pydantic_core"} <= tops
    versions = sorted(name.split(".cpython-")[1][:3] for name in cores)
    assert versions == ["311", "312", "313", "314"]


@needs_system_python
def test_a_cache_another_user_can_write_is_refused_not_imported(
    built: Path, tmp_path: Path
) -> None:
    """Whoever can write into the cache could put code there that nvcli would run."""
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    first = run_pyz(built / "nvcli.pyz", tmp_path, "version", env={"NVCLI_CACHE_DIR": str(cache)})
    assert first.rc == 0, first.err
    (unpacked,) = cache.iterdir()
    planted = unpacked / "site-packages" / "cli" / "main.py"
    (unpacked / "site-packages").chmod(0o777)
    planted.write_text("raise SystemExit('planted code ran')\n")

    refused = run_pyz(built / "nvcli.pyz", tmp_path, "version", env={"NVCLI_CACHE_DIR": str(cache)})
    assert refused.rc == 1
    assert "writable by others" in refused.err and "planted" not in refused.err


@needs_system_python
def test_the_built_zipapp_runs_twice_under_umask_002(built: Path, tmp_path: Path) -> None:
    for _ in range(2):
        ran = run_pyz(built / "nvcli.pyz", tmp_path, "version", umask=0o002)
        assert ran.rc == 0, ran.err
    assert writable_by_others(tmp_path / ".cache" / "nvcli") == []


def test_the_bootstrap_parses_on_old_pythons_so_they_are_told_what_they_need() -> None:
    source = (REPO / "cli" / "zipapp.py").read_text()
    ast.parse(source, feature_version=(3, 6))  # raises SyntaxError on newer syntax


def test_a_cache_of_another_uid_is_refused(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to give a directory to another user")
    other = tmp_path / "theirs"
    other.mkdir(mode=0o700)
    os.chown(other, 65534, 65534)
    with pytest.raises(zipapp.CacheError, match="belongs to uid 65534"):
        zipapp.check_private(str(other))


def test_the_cache_is_per_build_and_python_version(tmp_path: Path) -> None:
    root = zipapp.cache_root({"XDG_CACHE_HOME": str(tmp_path)})
    assert root == str(tmp_path / "nvcli")
    assert zipapp.cache_root({"NVCLI_CACHE_DIR": "/x", "XDG_CACHE_HOME": "/y"}) == "/x"
    a = zipapp.unpacked_dir(root, "ab" * 32, (3, 11))
    assert a != zipapp.unpacked_dir(root, "ab" * 32, (3, 12))
    assert a != zipapp.unpacked_dir(root, "cd" * 32, (3, 11))


def test_the_build_id_is_filled_in_from_the_payload(tmp_path: Path) -> None:
    from scripts.pack_zipapp import pack

    site = tmp_path / "site"
    (site / "cli").mkdir(parents=True)
    (site / "cli" / "__init__.py").write_text("")
    first = pack(site, tmp_path / "a.pyz", "/usr/bin/env python3")
    assert first == pack(site, tmp_path / "b.pyz", "/usr/bin/env python3")  # reproducible
    assert (tmp_path / "a.pyz").read_bytes() == (tmp_path / "b.pyz").read_bytes()
    (site / "cli" / "__init__.py").write_text("# changed\n")
    assert pack(site, tmp_path / "c.pyz", "/usr/bin/env python3") != first
    with zipfile.ZipFile(tmp_path / "c.pyz") as archive:
        main = archive.read("__main__.py").decode()
    assert 'BUILD_ID = "unbuilt"' not in main


def test_version_json_from_the_zipapp_is_the_packages(built: Path, tmp_path: Path) -> None:
    if not Path(SYSTEM_PYTHON).exists():
        pytest.skip(f"no system interpreter at {SYSTEM_PYTHON}")
    from cli import __version__

    done = run_pyz(built / "nvcli.pyz", tmp_path, "version", "-o", "json")
    assert done.rc == 0, done.err
    assert json.loads(done.out) == {"clientVersion": {"version": __version__}}


def test_the_krew_archive_is_the_zipapp_as_kubectl_gpu(built: Path, tmp_path: Path) -> None:
    """krew unpacks the archive and puts its `bin` on PATH; kubectl then runs it."""
    import tarfile

    import yaml

    from scripts.krew_manifest import TEMPLATE, render

    (archive,) = built.glob("kubectl-gpu_linux_*.tar.gz")
    with tarfile.open(archive) as tar:
        (member,) = tar.getmembers()
        assert (member.name, member.mode & 0o111) == ("kubectl-gpu", 0o111)
        tar.extractall(tmp_path / "bin", filter="data")
    plugin = tmp_path / "bin" / "kubectl-gpu"
    assert plugin.read_bytes() == (built / "nvcli.pyz").read_bytes()

    manifest = render(yaml.safe_load(TEMPLATE.read_text()), built, None, only_built=True)
    (platform,) = manifest["spec"]["platforms"]
    assert platform["uri"].endswith("/" + archive.name) and platform["bin"] == "kubectl-gpu"
    assert platform["sha256"] == hashlib.sha256(archive.read_bytes()).hexdigest()

    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("no kubectl (scripts/setup.sh installs Debian's kubernetes-client)")
    env = {"PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}", "HOME": str(tmp_path)}
    done = subprocess.run([kubectl, "gpu", "version"], capture_output=True, text=True, env=env,
                          timeout=300, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("nvcli ")
