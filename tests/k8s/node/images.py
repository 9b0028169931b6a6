"""Container images without a registry: busybox-static as one layer, an OCI image archive.

There is no registry to pull from here, so the node's images are written by hand
and imported with `ctr -n k8s.io images import`: the sandbox ("pause") image and
the image test pods run. Both are busybox; the pause image only sleeps.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import shutil
import subprocess
import tarfile
from collections.abc import Sequence
from pathlib import Path

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
OCI_LAYER = "application/vnd.oci.image.layer.v1.tar+gzip"


def _busybox_layer() -> bytes:
    """An uncompressed tar: /bin/busybox, a link per applet, and the usual empty dirs."""
    busybox = shutil.which("busybox")
    if busybox is None:
        raise RuntimeError("busybox is not installed (apt-get install busybox-static)")
    applets = subprocess.run(
        [busybox, "--list"], capture_output=True, text=True, check=True, timeout=10
    ).stdout.split()
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for directory in ("bin", "dev", "etc", "proc", "sys", "tmp", "root"):
            info = tarfile.TarInfo(directory)
            info.type, info.mode = tarfile.DIRTYPE, 0o1777 if directory == "tmp" else 0o755
            tar.addfile(info)
        tar.add(busybox, arcname="bin/busybox")
        for applet in applets:
            if applet == "busybox":
                continue
            link = tarfile.TarInfo(f"bin/{applet}")
            link.type, link.linkname, link.mode = tarfile.SYMTYPE, "busybox", 0o777
            tar.addfile(link)
    return buffer.getvalue()


def _blob(tar: tarfile.TarFile, data: bytes, media_type: str) -> dict[str, object]:
    digest = hashlib.sha256(data).hexdigest()
    info = tarfile.TarInfo(f"blobs/sha256/{digest}")
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))
    return {"mediaType": media_type, "digest": f"sha256:{digest}", "size": len(data)}


def _add_json(tar: tarfile.TarFile, name: str, value: object) -> None:
    data = json.dumps(value).encode()
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def write_busybox_image(path: Path, ref: str, command: Sequence[str]) -> Path:
    """An OCI image archive named `ref` (fully qualified) that runs `command` by default."""
    layer = _busybox_layer()
    compressed = gzip.compress(layer, compresslevel=1, mtime=0)
    config = {
        "architecture": "amd64",
        "os": "linux",
        "config": {"Env": ["PATH=/bin"], "Cmd": list(command)},
        "rootfs": {"type": "layers", "diff_ids": [f"sha256:{hashlib.sha256(layer).hexdigest()}"]},
    }
    with tarfile.open(path, "w") as tar:
        config_desc = _blob(tar, json.dumps(config).encode(), OCI_CONFIG)
        layer_desc = _blob(tar, compressed, OCI_LAYER)
        manifest = {
            "schemaVersion": 2,
            "mediaType": OCI_MANIFEST,
            "config": config_desc,
            "layers": [layer_desc],
        }
        manifest_desc = _blob(tar, json.dumps(manifest).encode(), OCI_MANIFEST)
        manifest_desc["annotations"] = {
            "io.containerd.image.name": ref,
            "org.opencontainers.image.ref.name": ref.rpartition(":")[2],
        }
        _add_json(tar, "oci-layout", {"imageLayoutVersion": "1.0.0"})
        _add_json(tar, "index.json", {"schemaVersion": 2, "manifests": [manifest_desc]})
    return path
