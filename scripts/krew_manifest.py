"""Writes dist/krew/gpu.yaml: deploy/krew/gpu.yaml with each platform's sha256 taken from
the archive scripts/build-cli.sh built for it.

    python3 scripts/krew_manifest.py [--dist dist] [--base-url URL] [--only-built]

A platform whose archive is not in DIST stops it (a release names every platform), unless
`--only-built`, which leaves that platform out: a manifest for local installs
(`kubectl krew install --manifest=dist/krew/gpu.yaml --archive=...`). `--base-url`: where
the archives are published, in place of the template's release URL.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
TEMPLATE = REPO / "deploy" / "krew" / "gpu.yaml"


def archive_name(platform: dict[str, Any]) -> str:
    labels = platform["selector"]["matchLabels"]
    return f"kubectl-gpu_{labels['os']}_{labels['arch']}.tar.gz"


def render(manifest: dict[str, Any], dist: Path, base_url: str | None, only_built: bool) -> dict:
    kept = []
    for platform in manifest["spec"]["platforms"]:
        archive = dist / archive_name(platform)
        if not archive.is_file():
            if only_built:
                continue
            raise SystemExit(f"krew_manifest: {archive} is missing (build it, or --only-built)")
        platform["sha256"] = hashlib.sha256(archive.read_bytes()).hexdigest()
        if base_url:
            platform["uri"] = f"{base_url.rstrip('/')}/{archive.name}"
        kept.append(platform)
    if not kept:
        raise SystemExit(f"krew_manifest: no archive in {dist}")
    manifest["spec"]["platforms"] = kept
    return manifest


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dist", type=Path, default=REPO / "dist")
    parser.add_argument("--base-url")
    parser.add_argument("--only-built", action="store_true")
    args = parser.parse_args()
    manifest = render(yaml.safe_load(TEMPLATE.read_text()), args.dist, args.base_url,
                      args.only_built)  # fmt: skip
    out = args.dist / "krew" / "gpu.yaml"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(yaml.safe_dump(manifest, sort_keys=False))
    print(f"{out}: {len(manifest['spec']['platforms'])} platform(s)", file=sys.stderr)


if __name__ == "__main__":
    main()
