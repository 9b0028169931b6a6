"""A notebook image for the real-node tier: Debian's IPython plus the project, no registry.

The rootfs is `mmdebstrap --variant=minbase bookworm` with `python3-ipython` (cached
under /var/cache/gpu-hotmount by its inputs, as scripts/build-image.sh caches the
agent's base), plus `/opt/gpu-hotmount` (the project's venv: cli.notebook,
pydantic) taken from the agent image the tier already built. The system python3 (the
same 3.11 the venv was made with) runs IPython with the venv's site-packages on
PYTHONPATH, as a notebook image with `pip install gpu-hotmount[notebook]` would have
them. It also carries the stand-in CUDA process (tests/fakes/driver/cuda_process.c) at
/usr/local/bin/cuda_process, which a notebook cell starts as a CUDA program it runs
(flow 26). Packed by scripts/oci_archive.py and imported with `ctr images import`.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import tarfile
import tempfile
from pathlib import Path

from tests.fakes import driver

REPO = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("HOTMOUNT_IMAGE_CACHE", "/var/cache/gpu-hotmount"))
MIRROR = os.environ.get("HOTMOUNT_DEBIAN_MIRROR", "http://deb.debian.org/debian")
REFERENCE = "gpu-hotmount/notebook:test"
SITE_PACKAGES = "/opt/gpu-hotmount/lib/python3.11/site-packages"
PACKAGES = "python3-ipython"


def cached_base() -> Path:
    """The Debian rootfs tarball with IPython, built once and cached: what
    tests/k8s/node/prebuild.sh builds ahead of the tier. One build at a time (a lock in
    the cache): a second caller waits, then finds it built."""
    CACHE.mkdir(parents=True, exist_ok=True)
    with (CACHE / ".notebook-base.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        with tempfile.TemporaryDirectory(dir=CACHE, prefix=".notebook-base-") as work:
            return _base(Path(work))


def _base(work: Path) -> Path:
    """The Debian rootfs tarball with IPython, built once and cached (in `work` first)."""
    args = [
        "--variant=minbase",
        f"--include={PACKAGES}",
        "--hook-dir=/usr/share/mmdebstrap/hooks/merged-usr",
        "--dpkgopt=path-exclude=/usr/share/doc/*",
        "--dpkgopt=path-exclude=/usr/share/man/*",
        "--dpkgopt=path-exclude=/usr/share/locale/*",
        "bookworm",
    ]
    key = hashlib.sha256(json.dumps([args, MIRROR]).encode()).hexdigest()[:16]
    base = CACHE / f"notebook-bookworm-{key}.tar"
    if base.exists():
        return base
    CACHE.mkdir(parents=True, exist_ok=True)
    partial = work / base.name
    done = subprocess.run(
        ["mmdebstrap", *args, str(partial), f"deb {MIRROR} bookworm main"],
        capture_output=True, text=True, timeout=1200, check=False, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"mmdebstrap failed:\n{done.stderr[-4000:]}")
    shutil.move(partial, base)
    return base


def _agent_layer(agent_archive: Path, work: Path) -> Path:
    """The agent image's one layer (a gzip tar), out of its OCI layout."""
    with tarfile.open(agent_archive) as oci:
        index = json.load(oci.extractfile("index.json"))  # type: ignore[arg-type]
        digest = index["manifests"][0]["digest"].split(":")[1]
        manifest = json.load(oci.extractfile(f"blobs/sha256/{digest}"))  # type: ignore[arg-type]
        layer = manifest["layers"][0]["digest"].split(":")[1]
        out = work / "agent-layer.tar.gz"
        with out.open("wb") as f:
            shutil.copyfileobj(oci.extractfile(f"blobs/sha256/{layer}"), f)  # type: ignore[arg-type]
    return out


def build_notebook_image(agent_archive: Path, directory: Path) -> Path:
    """The archive of `gpu-hotmount/notebook:test` (runs `sleep infinity`)."""
    work = directory / "notebook-image"
    root = work / "rootfs"
    root.mkdir(parents=True)
    subprocess.run(
        ["tar", "-C", str(root), "--numeric-owner", "-xpf", str(cached_base())], check=True
    )
    layer = _agent_layer(agent_archive, work)
    subprocess.run(
        ["tar", "-C", str(root), "--numeric-owner", "-xzpf", str(layer), "opt/gpu-hotmount"],
        check=True,
    )
    (root / "usr/local/bin").mkdir(parents=True, exist_ok=True)
    driver.build_cuda_process(root / "usr/local/bin/cuda_process")
    config = {
        "User": "0",
        "Env": [
            "PATH=/usr/local/bin:/usr/bin:/bin",
            "LANG=C.UTF-8",
            f"PYTHONPATH={SITE_PACKAGES}",
            "NVIDIA_VISIBLE_DEVICES=none",
        ],
        "Cmd": ["sleep", "infinity"],
    }
    (work / "config.json").write_text(json.dumps(config))
    archive = work / "notebook.oci.tar"
    subprocess.run(
        [
            "python3", str(REPO / "scripts" / "oci_archive.py"), "--rootfs", str(root),
            "--name", REFERENCE, "--config", str(work / "config.json"), "--epoch", "0",
            "--arch", "amd64", "--out", str(archive),
        ],
        check=True, capture_output=True, timeout=600,
    )  # fmt: skip
    shutil.rmtree(root, ignore_errors=True)
    return archive
