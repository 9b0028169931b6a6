"""deploy/krew/gpu.yaml: a krew Plugin manifest for every platform the zipapp is built for."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import yaml

from scripts.krew_manifest import TEMPLATE, archive_name, render

PLATFORMS = {("linux", "amd64"), ("linux", "arm64"), ("darwin", "amd64"), ("darwin", "arm64")}


def template() -> dict:
    return yaml.safe_load(TEMPLATE.read_text())


def test_the_manifest_has_what_krew_requires() -> None:
    manifest = template()
    assert manifest["apiVersion"] == "krew.googlecontainertools.github.com/v1alpha2"
    assert manifest["kind"] == "Plugin" and manifest["metadata"]["name"] == "gpu"
    spec = manifest["spec"]
    assert spec["version"].startswith("v") and spec["homepage"].startswith("https://")
    assert spec["shortDescription"] and spec["description"]
    found = set()
    for platform in spec["platforms"]:
        labels = platform["selector"]["matchLabels"]
        found.add((labels["os"], labels["arch"]))
        assert platform["bin"] == "kubectl-gpu"
        assert platform["uri"].endswith("/" + archive_name(platform))
        assert len(platform["sha256"]) == 64
    assert found == PLATFORMS


def test_rendering_fills_each_sha256_from_its_archive(tmp_path: Path) -> None:
    for os_name, arch in PLATFORMS:
        (tmp_path / f"kubectl-gpu_{os_name}_{arch}.tar.gz").write_bytes(f"{os_name}{arch}".encode())
    manifest = render(template(), tmp_path, "https://example.test/r/", only_built=False)
    for platform in manifest["spec"]["platforms"]:
        archive = tmp_path / archive_name(platform)
        assert platform["sha256"] == hashlib.sha256(archive.read_bytes()).hexdigest()
        assert platform["uri"] == f"https://example.test/r/{archive.name}"


def test_a_missing_archive_stops_a_release_manifest(tmp_path: Path) -> None:
    (tmp_path / "kubectl-gpu_linux_amd64.tar.gz").write_bytes(b"x")
    with pytest.raises(SystemExit, match=r"kubectl-gpu_linux_arm64\.tar\.gz is missing"):
        render(template(), tmp_path, None, only_built=False)
    local = render(template(), tmp_path, None, only_built=True)
    assert [archive_name(p) for p in local["spec"]["platforms"]] == [
        "kubectl-gpu_linux_amd64.tar.gz"
    ]
