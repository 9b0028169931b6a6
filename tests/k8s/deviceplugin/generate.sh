#!/usr/bin/env bash
# Regenerate the device plugin v1beta1 stubs from the vendored proto, as
# scripts/gen-podresources.sh does for PodResources: the proto is compiled from a
# scratch tree laid out as the package path, so the stubs import as a package and
# the descriptor's name cannot collide with the other vendored api.proto.
# Usage: tests/k8s/deviceplugin/generate.sh [python]   (default: .venv/bin/python)
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)"
python="${1:-$root/.venv/bin/python}"
pkg="tests/k8s/deviceplugin/generated"
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT

mkdir -p "$scratch/$pkg"
cp "$root/tests/k8s/deviceplugin/api.proto" "$scratch/$pkg/api.proto"
"$python" -m grpc_tools.protoc -I "$scratch" --python_out="$scratch" --pyi_out="$scratch" \
  --grpc_python_out="$scratch" "$scratch/$pkg/api.proto"

mkdir -p "$root/$pkg"
cp "$scratch/$pkg/api_pb2.py" "$scratch/$pkg/api_pb2.pyi" "$scratch/$pkg/api_pb2_grpc.py" "$root/$pkg/"
cat > "$root/$pkg/__init__.py" <<'PY'
"""Generated device plugin v1beta1 stubs; do not edit. Regenerate: tests/k8s/deviceplugin/generate.sh."""
PY
echo "regenerated $pkg with $("$python" -m grpc_tools.protoc --version)"
