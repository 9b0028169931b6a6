#!/usr/bin/env bash
# Builds nvcli for a laptop, no root needed:
#   dist/gpu_hotmount-<version>-py3-none-any.whl   pip install / pipx install it with [cli]
#   dist/nvcli.pyz                                 one file: python3 nvcli.pyz (3.11 or later)
#   dist/kubectl-gpu_<os>_<arch>.tar.gz             that file as the kubectl plugin, for krew
#
#   bash scripts/build-cli.sh                       for this machine's OS and CPU
#   bash scripts/build-cli.sh --platform macosx_11_0_arm64   for another (pip's platform tag)
#   DIST=/tmp/out bash scripts/build-cli.sh         somewhere else than dist/
#
# The zipapp carries every dependency of `.[cli]`. All are pure Python but one:
# pydantic-core is compiled, per CPython version and platform, so the zipapp holds its
# build for each of CPython 3.11-3.14 on the one platform it is made for.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

PYTHON=${PYTHON:-python3}
PLATFORM_ARGS=()
if [ "${1:-}" = "--platform" ]; then
  [ -n "${2:-}" ] || { echo "build-cli: --platform needs pip's platform tag" >&2; exit 2; }
  PLATFORM_ARGS=(--platform "$2")
  shift 2
fi
[ $# -eq 0 ] || { echo "usage: build-cli.sh [--platform TAG]" >&2; exit 2; }
PYTHON_VERSIONS=(3.11 3.12 3.13 3.14)

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$PYTHON" -m venv "$work/venv"
pip=("$work/venv/bin/python" -m pip --disable-pip-version-check -q)
"${pip[@]}" install build

DIST=${DIST:-dist}
mkdir -p "$DIST"
rm -f "$DIST"/gpu_hotmount-*.whl
"$work/venv/bin/python" -m build --wheel --outdir "$DIST" . >"$work/build.log" 2>&1 \
  || { cat "$work/build.log" >&2; exit 1; }
rm -rf build  # setuptools' scratch directory in the tree
wheel=$(ls "$DIST"/gpu_hotmount-*.whl)

# Binary wheels only, for the oldest CPython nvcli supports: what pip would install there.
site="$work/site-packages"
"${pip[@]}" install --target "$site" --only-binary=:all: --implementation cp \
  --python-version "${PYTHON_VERSIONS[0]}" "${PLATFORM_ARGS[@]}" "$wheel[cli]"
rm -rf "$site/bin"  # console scripts written for this venv's interpreter; the zipapp has its own

# pydantic-core's extension for each newer CPython, beside the first (each name carries
# its version: _pydantic_core.cpython-312-x86_64-linux-gnu.so).
core=$(sed -n 's/^Version: //p' "$site"/pydantic_core-*.dist-info/METADATA)
for version in "${PYTHON_VERSIONS[@]:1}"; do
  "${pip[@]}" install --target "$work/core-$version" --no-deps --only-binary=:all: \
    --implementation cp --python-version "$version" "${PLATFORM_ARGS[@]}" "pydantic-core==$core"
  cp "$work/core-$version"/pydantic_core/_pydantic_core.*.so "$site/pydantic_core/"
done

"$PYTHON" scripts/pack_zipapp.py "$site" "$DIST/nvcli.pyz"

# krew's names for the platform: from the tag given, else from this machine.
tag=${PLATFORM_ARGS[1]:-$(uname -s)_$(uname -m)}
case "$tag" in
  manylinux*x86_64|Linux_x86_64) target=linux_amd64 ;;
  manylinux*aarch64|Linux_aarch64) target=linux_arm64 ;;
  macosx*x86_64|Darwin_x86_64) target=darwin_amd64 ;;
  macosx*arm64|Darwin_arm64) target=darwin_arm64 ;;
  *) target="" ; echo "build-cli: no krew archive for platform $tag" >&2 ;;
esac
if [ -n "$target" ]; then
  mkdir -p "$work/plugin"
  cp "$DIST/nvcli.pyz" "$work/plugin/kubectl-gpu"
  tar --sort=name --owner=0 --group=0 --mtime=@0 -czf "$DIST/kubectl-gpu_$target.tar.gz" \
    -C "$work/plugin" kubectl-gpu
  echo "built $DIST/kubectl-gpu_$target.tar.gz"
fi
echo "built $wheel"
