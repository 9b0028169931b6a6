#!/usr/bin/env bash
# Builds the DRA example driver's kubelet plugin (sigs.k8s.io/dra-example-driver, the
# version dra-driver/go.mod's tool line requires, with the k8s.io modules of that
# release: v0.4.0 does not compile against k8s.io/api v0.37) and caches it outside the
# checkout, keyed by version, with Go's module and build caches beside the 1.37 stack's.
#   usage: build-dra-driver.sh      prints one line: dra-driver=DIR
# Environment: HOTMOUNT_K8S_CACHE (default /var/cache/gpu-hotmount).
set -euo pipefail
if [ -x /usr/local/go/bin/go ]; then export PATH="/usr/local/go/bin:$PATH"; fi
here="$(cd "$(dirname "$0")/dra-driver" && pwd)"
cache="${HOTMOUNT_K8S_CACHE:-/var/cache/gpu-hotmount}"
export GOMODCACHE="$cache/go/mod" GOCACHE="$cache/go/build" GOFLAGS=-mod=readonly GOTOOLCHAIN=local
# One Go build at a time in this cache (see build-go.sh); the caller of build-go.sh holds it.
mkdir -p "$cache"; exec 8>"$cache/.go-build.lock"; flock 8
module=sigs.k8s.io/dra-example-driver
version="$(sed -n "s#^\s*\(require \)\?$module \(v[0-9.]*\).*#\2#p" "$here/go.mod" | head -1)"
bin="$cache/dra-example-driver-${version#v}/bin"
plugin=dra-example-kubeletplugin
if [ ! -x "$bin/$plugin" ]; then
    start=$(date +%s)
    echo "build: $module $version" >&2
    mkdir -p "$bin"
    (cd "$here" && go build -trimpath -ldflags "-s -w" -o "$bin/.$plugin.new" "$module/cmd/$plugin") >&2
    mv "$bin/.$plugin.new" "$bin/$plugin"
    echo "build: done in $(( $(date +%s) - start )) s" >&2
fi
echo "dra-driver=$bin"
