#!/usr/bin/env bash
# Builds NVIDIA's own device plugin (github.com/NVIDIA/k8s-device-plugin, cmd/nvidia-device-plugin)
# from its Go module (go.mod here, a `tool` line pins the release) and caches the binary outside
# the checkout keyed by version; Go's module and build caches live there too, so a second run
# builds nothing. cgo is needed: go-nvml dlopens libnvidia-ml.so.1 through cgo (on the tier that
# is the project's fake, tests/fakes/nvml).
#   usage: build.sh        prints the binary's directory on stdout
# Environment: HOTMOUNT_K8S_CACHE (default /var/cache/gpu-hotmount).
set -euo pipefail
if [ -x /usr/local/go/bin/go ]; then export PATH="/usr/local/go/bin:$PATH"; fi
cd "$(dirname "$0")"
version="$(sed -n 's#^\s*\(require \)\?github.com/NVIDIA/k8s-device-plugin \(v[0-9.]*\).*#\2#p' go.mod | head -1)"
cache="${HOTMOUNT_K8S_CACHE:-/var/cache/gpu-hotmount}"
bin="$cache/nvidia-device-plugin-${version#v}/bin"
# One Go build at a time in this cache (see build-go.sh); the caller of build-go.sh holds it.
mkdir -p "$cache"; exec 8>"$cache/.go-build.lock"; flock 8
if [ -x "$bin/nvidia-device-plugin" ]; then echo "$bin"; exit 0; fi

export GOMODCACHE="$cache/go/mod" GOCACHE="$cache/go/build" GOFLAGS=-mod=readonly GOTOOLCHAIN=local
start=$(date +%s)
echo "build: nvidia-device-plugin $version" >&2
mkdir -p "$bin"
CGO_ENABLED=1 go build -trimpath -ldflags "-s -w -X github.com/NVIDIA/k8s-device-plugin/internal/info.version=$version" \
    -o "$bin/.nvidia-device-plugin.new" github.com/NVIDIA/k8s-device-plugin/cmd/nvidia-device-plugin >&2
mv "$bin/.nvidia-device-plugin.new" "$bin/nvidia-device-plugin"
echo "build: done in $(( $(date +%s) - start )) s" >&2
echo "$bin"
