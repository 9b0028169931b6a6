"""Packs a staged site-packages into dist/nvcli.pyz (scripts/build-cli.sh calls it).

    python3 scripts/pack_zipapp.py SITE_PACKAGES OUTPUT [--interpreter '/usr/bin/env python3']

The archive holds three entries: `__main__.py` (cli/zipapp.py with BUILD_ID set to the
payload's sha256), and `site-packages.zip`, stored uncompressed so that the first run
reads it without inflating it twice. Entries carry a fixed date and sorted names, so the
same stage gives the same bytes (and the same BUILD_ID).
"""

from __future__ import annotations

import argparse
import hashlib
import io
import os
import re
import stat
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
EPOCH = (1980, 1, 1, 0, 0, 0)


def _entry(name: str, mode: int = 0o644, compress: int = zipfile.ZIP_DEFLATED) -> zipfile.ZipInfo:
    """A fixed-date entry: writestr takes the compression from it, not from the archive."""
    info = zipfile.ZipInfo(name, EPOCH)
    info.external_attr = (stat.S_IFREG | mode) << 16
    info.compress_type = compress
    return info


def payload(site_packages: Path) -> bytes:
    """Every file under `site_packages`, deflated, in a stable order; no bytecode (each
    interpreter compiles its own on the first run)."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for path in sorted(site_packages.rglob("*")):
            if path.is_dir() or "__pycache__" in path.parts or path.suffix == ".pyc":
                continue
            mode = 0o755 if os.access(path, os.X_OK) else 0o644
            name = path.relative_to(site_packages).as_posix()
            archive.writestr(_entry(name, mode), path.read_bytes(), compresslevel=9)
    return buffer.getvalue()


def bootstrap(build_id: str) -> str:
    source = (REPO / "cli" / "zipapp.py").read_text()
    filled, found = re.subn(r'^BUILD_ID = "unbuilt"', f'BUILD_ID = "{build_id}"', source,
                            count=1, flags=re.MULTILINE)  # fmt: skip
    if found != 1:
        raise SystemExit("cli/zipapp.py: no BUILD_ID line to fill in")
    return filled


def pack(site_packages: Path, output: Path, interpreter: str) -> str:
    inner = payload(site_packages)
    build_id = hashlib.sha256(inner).hexdigest()
    output.parent.mkdir(parents=True, exist_ok=True)
    partial = output.with_suffix(".partial")
    with partial.open("wb") as file:
        file.write(f"#!{interpreter}\n".encode())
        with zipfile.ZipFile(file, "w") as archive:
            main = bootstrap(build_id).encode()
            archive.writestr(_entry("__main__.py"), main)
            archive.writestr(_entry("site-packages.zip", compress=zipfile.ZIP_STORED), inner)
    partial.chmod(0o755)
    partial.replace(output)
    return build_id


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("site_packages", type=Path)
    parser.add_argument("output", type=Path)
    parser.add_argument("--interpreter", default="/usr/bin/env python3")
    args = parser.parse_args()
    build_id = pack(args.site_packages, args.output, args.interpreter)
    size = args.output.stat().st_size / 1e6
    print(f"{args.output}: {size:.1f} MB, build {build_id[:16]}")


if __name__ == "__main__":
    main()
