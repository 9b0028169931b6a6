"""Pack a root filesystem directory as a one-layer OCI image archive (Python stdlib only).

    python3 scripts/oci_archive.py --rootfs DIR --name gpu-hotmount/agent:0.1.0 \\
        --config config.json --epoch SECONDS --out agent.oci.tar

scripts/build-image.sh runs it; no Docker daemon, buildah or umoci is needed. The
archive is an OCI image layout in a tar (what `ctr images import`, `skopeo copy
oci-archive:` and `podman load` read). index.json names the image twice, as BuildKit's
OCI exporter does: `io.containerd.image.name` (the full reference, which ctr and the
CRI plugin use) and `org.opencontainers.image.ref.name` (the tag).

Reproducible-ish: entries sorted, owners numeric, every mtime clamped to --epoch, gzip
without a timestamp; the same rootfs and epoch give the same digests.
"""

from __future__ import annotations

import argparse
import datetime
import gzip
import hashlib
import io
import json
import os
import stat
import tarfile
import tempfile
from pathlib import Path
from typing import IO, Any

# Kept as empty directories: the runtime mounts its own /dev, /proc and /sys.
EMPTIED = ("dev", "proc", "sys", "tmp", "run")
# Debian's architecture names where OCI (Go's GOARCH) differs.
ARCHITECTURES = {"amd64": "amd64", "arm64": "arm64", "ppc64el": "ppc64le", "s390x": "s390x"}
MANIFEST = "application/vnd.oci.image.manifest.v1+json"
INDEX = "application/vnd.oci.image.index.v1+json"
CONFIG = "application/vnd.oci.image.config.v1+json"
LAYER = "application/vnd.oci.image.layer.v1.tar+gzip"


class _Hashing(io.RawIOBase):
    """A write-only stream that hashes and counts what passes through to `target`."""

    def __init__(self, target: IO[bytes]) -> None:
        self.target = target
        self.sha = hashlib.sha256()
        self.size = 0

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        view = memoryview(data)
        self.sha.update(view)
        self.size += len(view)
        self.target.write(view)
        return len(view)


def normalize_reference(name: str) -> str:
    """`gpu-hotmount/agent:1` -> `docker.io/gpu-hotmount/agent:1`, as containerd's CRI does."""
    first, _, rest = name.partition("/")
    if not rest:
        return f"docker.io/library/{name}"
    if "." in first or ":" in first or first == "localhost":
        return name
    return f"docker.io/{name}"


def _entries(rootfs: Path) -> list[str]:
    """Every path below `rootfs`, relative and sorted; what EMPTIED holds left out."""
    found: list[str] = []
    for directory, dirs, files in os.walk(rootfs):
        relative = os.path.relpath(directory, rootfs)
        if relative in EMPTIED:
            dirs.clear()
            continue
        for name in dirs + files:
            found.append(os.path.normpath(os.path.join(relative, name)))
    return sorted(found)


def write_layer(rootfs: Path, epoch: int, out: IO[bytes]) -> tuple[str, str, int]:
    """Tar and gzip `rootfs` into `out`: (diff_id, digest, compressed size)."""
    compressed = _Hashing(out)
    with gzip.GzipFile(fileobj=compressed, mode="wb", mtime=0, compresslevel=6) as zipped:
        plain = _Hashing(zipped)  # type: ignore[arg-type]
        with tarfile.open(fileobj=plain, mode="w|", format=tarfile.PAX_FORMAT) as tar:
            for relative in _entries(rootfs):
                path = rootfs / relative
                info = tar.gettarinfo(str(path), arcname=relative)
                if info is None:  # a socket: nothing a layer can hold
                    continue
                info.uname = info.gname = ""
                info.mtime = min(int(info.mtime), epoch)
                if info.isreg():
                    with path.open("rb") as data:
                        tar.addfile(info, data)
                else:
                    tar.addfile(info)
    return (
        f"sha256:{plain.sha.hexdigest()}",
        f"sha256:{compressed.sha.hexdigest()}",
        compressed.size,
    )


def _blob(layout: Path, data: bytes) -> tuple[str, int]:
    digest = hashlib.sha256(data).hexdigest()
    (layout / "blobs" / "sha256" / digest).write_bytes(data)
    return f"sha256:{digest}", len(data)


def _json(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


def pack(rootfs: Path, name: str, image_config: dict, epoch: int, arch: str, out: Path) -> str:
    """Write the archive to `out`; return the manifest's digest."""
    if arch not in ARCHITECTURES:
        raise SystemExit(f"oci_archive: no OCI name for Debian architecture {arch!r}")
    created = datetime.datetime.fromtimestamp(epoch, datetime.UTC)
    created_text = created.strftime("%Y-%m-%dT%H:%M:%SZ")
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=".oci-") as scratch:
        layout = Path(scratch)
        (layout / "blobs" / "sha256").mkdir(parents=True)
        layer_tmp = layout / "layer.tmp"
        with layer_tmp.open("wb") as handle:
            diff_id, layer_digest, layer_size = write_layer(rootfs, epoch, handle)
        layer_tmp.rename(layout / "blobs" / "sha256" / layer_digest.removeprefix("sha256:"))
        config = {
            "architecture": ARCHITECTURES[arch],
            "os": "linux",
            "created": created_text,
            "config": image_config,
            "rootfs": {"type": "layers", "diff_ids": [diff_id]},
            "history": [{"created": created_text, "created_by": "scripts/build-image.sh"}],
        }
        config_digest, config_size = _blob(layout, _json(config))
        manifest = {
            "schemaVersion": 2,
            "mediaType": MANIFEST,
            "config": {"mediaType": CONFIG, "digest": config_digest, "size": config_size},
            "layers": [{"mediaType": LAYER, "digest": layer_digest, "size": layer_size}],
            "annotations": {"org.opencontainers.image.created": created_text},
        }
        manifest_digest, manifest_size = _blob(layout, _json(manifest))
        tag = name.rpartition(":")[2] if ":" in name.rpartition("/")[2] else "latest"
        index = {
            "schemaVersion": 2,
            "mediaType": INDEX,
            "manifests": [
                {
                    "mediaType": MANIFEST,
                    "digest": manifest_digest,
                    "size": manifest_size,
                    "platform": {"architecture": ARCHITECTURES[arch], "os": "linux"},
                    "annotations": {
                        "io.containerd.image.name": normalize_reference(name),
                        "org.opencontainers.image.ref.name": tag,
                    },
                }
            ],
        }
        (layout / "index.json").write_bytes(_json(index))
        (layout / "oci-layout").write_bytes(_json({"imageLayoutVersion": "1.0.0"}))
        partial = out.with_name(out.name + ".partial")
        with tarfile.open(partial, "w", format=tarfile.PAX_FORMAT) as archive:
            for relative in ("oci-layout", "index.json", "blobs", "blobs/sha256"):
                _add_plain(archive, layout, relative, epoch)
            for blob in sorted((layout / "blobs" / "sha256").iterdir()):
                _add_plain(archive, layout, f"blobs/sha256/{blob.name}", epoch)
        os.replace(partial, out)
    return manifest_digest


def _add_plain(archive: tarfile.TarFile, layout: Path, relative: str, epoch: int) -> None:
    path = layout / relative
    info = archive.gettarinfo(str(path), arcname=relative)
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.mtime = epoch
    info.mode = 0o755 if stat.S_ISDIR(info.mode) else 0o644
    if info.isreg():
        with path.open("rb") as data:
            archive.addfile(info, data)
    else:
        archive.addfile(info)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rootfs", type=Path, required=True)
    parser.add_argument(
        "--name", required=True, help="image reference, e.g. gpu-hotmount/agent:0.1.0"
    )
    parser.add_argument(
        "--config", type=Path, required=True, help="the image config's `config` object (JSON)"
    )
    parser.add_argument(
        "--epoch", type=int, required=True, help="created time; mtimes are clamped to it"
    )
    parser.add_argument(
        "--arch", required=True, help="Debian architecture (dpkg --print-architecture)"
    )
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    image_config = json.loads(args.config.read_text())
    digest = pack(args.rootfs, args.name, image_config, args.epoch, args.arch, args.out.resolve())
    print(digest)


if __name__ == "__main__":
    main()
