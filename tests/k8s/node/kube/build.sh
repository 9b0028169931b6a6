#!/usr/bin/env bash
# Builds the real-node tier's Kubernetes binaries from Go modules (go.mod here, made by
# gen-go-mod.sh from k/k's own go.mod) in ONE `go build`, so the packages the binaries
# share compile once, and caches them outside the checkout keyed by version; Go's module
# and build caches live there too, so a second run builds nothing.
#   usage: build.sh        prints the binaries' directory on stdout
# Environment: HOTMOUNT_K8S_CACHE (default /var/cache/gpu-hotmount).
set -euo pipefail
# Go 1.26+ (k/k's go.mod says `go 1.26.0`, and GOTOOLCHAIN=local fetches none): the
# machine's /usr/local/go before Debian's older golang-go that the 1.20 build installs.
if [ -x /usr/local/go/bin/go ]; then export PATH="/usr/local/go/bin:$PATH"; fi
cd "$(dirname "$0")"
version="$(sed -n 's/^\tk8s.io\/kubernetes \(v[0-9.]*\).*/\1/p' go.mod)"
cache="${HOTMOUNT_K8S_CACHE:-/var/cache/gpu-hotmount}"
bin="$cache/kubernetes-${version#v}/bin"
binaries=(kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kubectl)
missing=()
for b in "${binaries[@]}"; do [ -x "$bin/$b" ] || missing+=("$b"); done
if [ ${#missing[@]} -eq 0 ]; then echo "$bin"; exit 0; fi

export GOMODCACHE="$cache/go/mod" GOCACHE="$cache/go/build" GOFLAGS=-mod=readonly GOTOOLCHAIN=local
minor="${version#v1.}"; minor="${minor%%.*}"
ldflags=("-s" "-w")
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ldflags+=("-X" "$pkg.gitVersion=$version" "-X" "$pkg.gitMajor=1" "-X" "$pkg.gitMinor=$minor"
              "-X" "$pkg.gitTreeState=clean" "-X" "$pkg.buildDate=1970-01-01T00:00:00Z")
done
packages=()
for b in "${missing[@]}"; do packages+=("k8s.io/kubernetes/cmd/$b"); done
mkdir -p "$bin.tmp"
start=$(date +%s)
echo "build: ${missing[*]} (Kubernetes $version)" >&2
go build -trimpath -ldflags "${ldflags[*]}" -o "$bin.tmp/" "${packages[@]}" >&2
mkdir -p "$bin"
for b in "${missing[@]}"; do mv "$bin.tmp/$b" "$bin/$b"; done
rmdir "$bin.tmp"
echo "build: done in $(( $(date +%s) - start )) s" >&2
echo "$bin"
