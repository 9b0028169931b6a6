#!/usr/bin/env bash
# Regenerate the kubelet PodResources v1 stubs from the vendored proto.
#
# The proto is copied into a scratch tree laid out as the package path
# (agent/podresources/generated/api.proto) and compiled with that tree as the
# include root. protoc then writes `from agent.podresources.generated import
# api_pb2` into api_pb2_grpc.py, so the stubs work as a package import with no
# sed, and the descriptor is registered under a path-qualified name that cannot
# collide with other vendored files called api.proto (the device plugin API).
#
# Usage: scripts/gen-podresources.sh [python]   (default: .venv/bin/python)
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python="${1:-$root/.venv/bin/python}"
pkg="agent/podresources/generated"
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT

mkdir -p "$scratch/$pkg"
cp "$root/agent/podresources/api.proto" "$scratch/$pkg/api.proto"

"$python" -m grpc_tools.protoc \
  -I "$scratch" \
  --python_out="$scratch" \
  --pyi_out="$scratch" \
  --grpc_python_out="$scratch" \
  "$scratch/$pkg/api.proto"

mkdir -p "$root/$pkg"
cp "$scratch/$pkg/api_pb2.py" "$scratch/$pkg/api_pb2.pyi" "$scratch/$pkg/api_pb2_grpc.py" "$root/$pkg/"
cat > "$root/$pkg/__init__.py" <<'PY'
"""Generated kubelet PodResources v1 stubs; do not edit. Regenerate: scripts/gen-podresources.sh."""
PY
echo "regenerated $pkg with $("$python" -m grpc_tools.protoc --version)"
