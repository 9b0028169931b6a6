"""The start of `nvcli.pyz`, the one-file nvcli (scripts/build-cli.sh copies this module
into the archive as its `__main__.py`, with BUILD_ID filled in).

Why not run the packages from the archive itself: pydantic-core is a compiled extension,
which zipimport cannot load, and a zip of ~10,000 files costs every run reading its
directory (shiv's layout measured ~80 ms per run here, doubling `nvcli version`). So
the archive holds a second zip, `site-packages.zip`; the first run unpacks it once into
the user's cache, compiles it for the running interpreter, and every run after imports
from there as an installed nvcli does.

The cache is trusted code: a directory another user can write into, or that belongs to
someone else, is refused, never imported from. So it is unpacked under umask 077
whatever the user's own (Ubuntu's and Fedora's 002 made every directory group-writable,
and each run then refused its own cache), and every directory unpacked is checked before
the cache is marked complete. It parses on Python 3.6 and up, so that
an interpreter too old for nvcli is told so rather than shown a syntax error.
"""

from __future__ import annotations

import os
import sys

BUILD_ID = "unbuilt"  # scripts/pack_zipapp.py: the payload's sha256
PAYLOAD = "site-packages.zip"
MINIMUM_PYTHON = (3, 11)
COMPLETE = ".complete"


class CacheError(Exception):
    """The cache cannot be trusted or written: said in one line, nothing imported."""


def cache_root(environ: dict[str, str] | None = None) -> str:
    """$NVCLI_CACHE_DIR, else $XDG_CACHE_HOME/nvcli, else ~/.cache/nvcli."""
    env = os.environ if environ is None else environ
    if env.get("NVCLI_CACHE_DIR"):
        return env["NVCLI_CACHE_DIR"]
    base = env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "nvcli")


def unpacked_dir(root: str, build_id: str, version: tuple[int, ...]) -> str:
    """One directory per build and interpreter version: bytecode is per version."""
    return os.path.join(root, f"{build_id[:16]}-py{version[0]}{version[1]}")


def check_private(path: str) -> None:
    """`path` is this user's, and no one else may write to it."""
    info = os.stat(path)
    if info.st_uid != os.geteuid():
        raise CacheError(f"{path} belongs to uid {info.st_uid}, not to this user")
    if info.st_mode & 0o022:
        raise CacheError(f"{path} is writable by others (mode {info.st_mode & 0o777:o})")


def site_packages(archive: str, root: str, build_id: str = BUILD_ID) -> str:
    """Where the packages are, unpacked and compiled on first use."""
    target = unpacked_dir(root, build_id, sys.version_info)
    if not os.path.isfile(os.path.join(target, COMPLETE)):
        _unpack(archive, root, target)
    for path in (root, target, os.path.join(target, "site-packages")):
        check_private(path)
    return os.path.join(target, "site-packages")


def _unpack(archive: str, root: str, target: str) -> None:
    """Unpack into a fresh directory beside `target`, then rename it into place: a run
    that stops midway, or two first runs at once, never leave a half-filled `target`."""
    was = os.umask(0o077)  # every file and directory made here is the user's alone
    try:
        _unpack_private(archive, root, target)
    finally:
        os.umask(was)


def _unpack_private(archive: str, root: str, target: str) -> None:
    import compileall
    import shutil
    import tempfile
    import zipfile

    os.makedirs(root, mode=0o700, exist_ok=True)
    check_private(root)
    staging = tempfile.mkdtemp(prefix=".unpack-", dir=root)
    try:
        # Nested, not parenthesized: this file must parse on old interpreters.
        with zipfile.ZipFile(archive) as outer, outer.open(PAYLOAD) as inner_file:  # noqa: SIM117
            with zipfile.ZipFile(inner_file) as inner:
                inner.extractall(os.path.join(staging, "site-packages"))
        compileall.compile_dir(os.path.join(staging, "site-packages"), quiet=2, workers=0)
        for directory, _, _ in os.walk(staging):
            check_private(directory)
        with open(os.path.join(staging, COMPLETE), "w") as done:
            done.write(BUILD_ID + "\n")
        try:
            os.rename(staging, target)
        except OSError:
            if not os.path.isfile(os.path.join(target, COMPLETE)):
                raise  # not another run's finished copy: a real failure
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def main() -> int:
    if sys.version_info < MINIMUM_PYTHON:
        wanted = ".".join(map(str, MINIMUM_PYTHON))
        sys.stderr.write(
            f"nvcli needs Python {wanted} or later; this is {sys.version.split()[0]} "
            f"({sys.executable}). Run it with a newer python3: python3.11 {sys.argv[0]}\n"
        )
        return 1
    try:
        where = site_packages(os.path.dirname(os.path.abspath(__file__)), cache_root())
    except (CacheError, OSError) as exc:
        sys.stderr.write(f"nvcli: cannot use the cache {cache_root()}: {exc}\n")
        sys.stderr.write("set NVCLI_CACHE_DIR to a private directory\n")
        return 1
    sys.path.insert(0, where)
    from cli.main import main as nvcli

    return nvcli()


if __name__ == "__main__":
    sys.exit(main())
