#!/usr/bin/env bash
# Builds the real-node tier's current stack from Go modules and caches it outside the
# checkout, keyed by version: Kubernetes (kube/build.sh, one `go build` for the five
# server binaries and kubectl), etcd 3.6 (etcd/, etcdmain.Main), and containerd 2 with
# its runc shim and ctr (containerd/, the go.mod's tool lines, -tags no_btrfs) and runc
# (cgo, -tags seccomp). Go's module and build caches live in the same cache, so a
# second run builds nothing.
#   usage: build-go.sh      prints three lines: kubernetes=DIR etcd=DIR containerd=DIR
# Environment: HOTMOUNT_K8S_CACHE (default /var/cache/gpu-hotmount).
set -euo pipefail
# Go 1.26+ (k/k's go.mod says `go 1.26.0`, and GOTOOLCHAIN=local fetches none): the
# machine's /usr/local/go before Debian's older golang-go that the 1.20 build installs.
if [ -x /usr/local/go/bin/go ]; then export PATH="/usr/local/go/bin:$PATH"; fi
here="$(cd "$(dirname "$0")" && pwd)"
cache="${HOTMOUNT_K8S_CACHE:-/var/cache/gpu-hotmount}"
export GOMODCACHE="$cache/go/mod" GOCACHE="$cache/go/build" GOFLAGS=-mod=readonly GOTOOLCHAIN=local
# One Go build at a time in this cache (scripts/test.sh starts the tier's builds in the
# background, tests/k8s/node/prebuild.sh): a second caller waits, then finds them built.
mkdir -p "$cache"; exec 8>"$cache/.go-build.lock"; flock 8

# module_version DIR MODULE: the version DIR/go.mod requires of MODULE
module_version() { sed -n "s#^\s*\(require \)\?$2 \(v[0-9.]*\).*#\2#p" "$1/go.mod" | head -1; }

# build_tools DIR BIN TAGS PACKAGE...: one go build of PACKAGEs into BIN unless all are there
build_tools() {
    local dir="$1" bin="$2" tags="$3"; shift 3
    local missing=() pkg
    for pkg in "$@"; do [ -x "$bin/$(basename "$pkg")" ] || missing+=("$pkg"); done
    [ ${#missing[@]} -eq 0 ] && return 0
    local start; start=$(date +%s)
    echo "build: ${missing[*]}" >&2
    rm -rf "$bin.tmp" && mkdir -p "$bin.tmp" "$bin"
    (cd "$dir" && go build -trimpath -tags "$tags" -ldflags "-s -w ${EXTRA_LDFLAGS:-}" -o "$bin.tmp/" "${missing[@]}") >&2
    for pkg in "${missing[@]}"; do mv "$bin.tmp/$(basename "$pkg")" "$bin/"; done
    rmdir "$bin.tmp"
    echo "build: done in $(( $(date +%s) - start )) s" >&2
}

kubernetes="$(bash "$here/kube/build.sh")"

etcd_version="$(module_version "$here/etcd" go.etcd.io/etcd/server/v3)"
etcd="$cache/etcd-${etcd_version#v}/bin"
# `go build .` names the binary after the module (etcd); build it by directory path.
if [ ! -x "$etcd/etcd" ]; then
    start=$(date +%s)
    echo "build: etcd $etcd_version" >&2
    mkdir -p "$etcd"
    (cd "$here/etcd" && go build -trimpath -ldflags "-s -w" -o "$etcd/.etcd.new" .) >&2
    mv "$etcd/.etcd.new" "$etcd/etcd"
    echo "build: done in $(( $(date +%s) - start )) s" >&2
fi

containerd_version="$(module_version "$here/containerd" github.com/containerd/containerd/v2)"
containerd="$cache/containerd-${containerd_version#v}/bin"
# The release's version stamped as containerd's Makefile stamps it (version.Version;
# the module's source says "2.2.9+unknown"), which the kubelet reports as the runtime's
# (flow 21). A cache built without it is built again.
if [ -x "$containerd/containerd" ] && "$containerd/containerd" --version | grep -q '+unknown'; then
    rm -f "$containerd/containerd" "$containerd/containerd-shim-runc-v2" "$containerd/ctr"
fi
EXTRA_LDFLAGS="-X github.com/containerd/containerd/v2/version.Version=${containerd_version#v}" \
build_tools "$here/containerd" "$containerd" no_btrfs \
    github.com/containerd/containerd/v2/cmd/containerd \
    github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2 \
    github.com/containerd/containerd/v2/cmd/ctr
# runc with seccomp (cgo, libseccomp-dev): pods asking RuntimeDefault fail without it.
if [ -x "$containerd/runc" ] && ! "$containerd/runc" --version | grep -q libseccomp; then
    rm "$containerd/runc"
fi
CGO_ENABLED=1 build_tools "$here/containerd" "$containerd" seccomp github.com/opencontainers/runc

echo "kubernetes=$kubernetes"
echo "etcd=$etcd"
echo "containerd=$containerd"
