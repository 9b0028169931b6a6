#!/usr/bin/env bash
# Builds the Kubernetes server binaries the real-node tier needs from Debian's
# own source package (1.20.2, vendor/ included) with Debian's Go, and caches
# them outside the checkout, keyed by version, so a second run builds nothing.
# Only the binaries missing from the cache are built (adding one to the list
# costs one small build, not all of them again).
#   usage: build-kubernetes.sh            prints the cache directory on stdout
# Environment: HOTMOUNT_K8S_CACHE (default /var/cache/gpu-hotmount), K8S_VERSION.
set -euo pipefail
version="${K8S_VERSION:-1.20.2}"
cache="${HOTMOUNT_K8S_CACHE:-/var/cache/gpu-hotmount}/kubernetes-${version}"
# kube-proxy: ClusterIP Services (a pod reaching the agents through their Service).
binaries=(kube-apiserver kubelet kube-scheduler kube-controller-manager kube-proxy)

missing=()
for b in "${binaries[@]}"; do [ -x "$cache/bin/$b" ] || missing+=("$b"); done
if [ ${#missing[@]} -eq 0 ]; then echo "$cache/bin"; exit 0; fi

log() { echo "build-kubernetes: $*" >&2; }
export DEBIAN_FRONTEND=noninteractive
if ! grep -qs 'deb-src' /etc/apt/sources.list.d/debian.sources; then
    log "enabling Debian source lists"
    sed -i 's/^Types: deb$/Types: deb deb-src/' /etc/apt/sources.list.d/debian.sources
    apt-get update -qq >&2
fi
apt-get install -y -qq golang-go rsync dpkg-dev >/dev/null

work="$(mktemp -d /var/tmp/k8s-build.XXXXXX)"
trap 'rm -rf "$work"' EXIT
cd "$work"
log "fetching Debian's kubernetes source package"
apt-get source --download-only kubernetes >&2
dpkg-source --no-check -x ./kubernetes_*.dsc src >&2
# Debian versions it "1.20.5+really1.20.2-…": the tree is what follows "really".
upstream="$(sed -n 's/^Version: //p' kubernetes_*.dsc | head -1)"
upstream="${upstream##*really}"; upstream="${upstream%%-*}"
[ "$upstream" = "$version" ] || { log "Debian serves kubernetes $upstream, not $version"; exit 1; }

mkdir -p .go/src/k8s.io
ln -s "$work/src" .go/src/k8s.io/kubernetes
cd .go/src/k8s.io/kubernetes
log "building ${missing[*]} (several minutes)"
what="$(printf 'cmd/%s ' "${missing[@]}")"
GOPATH="$work/.go" CGO_ENABLED=0 GOFLAGS=-mod=vendor GO111MODULE=off \
    make WHAT="${what% }" >&2
out="_output/local/bin/linux/$(go env GOARCH)"
mkdir -p "$cache/bin"
# Install each under a temporary name, then rename: a binary in the cache is whole.
for b in "${missing[@]}"; do
    install -m 0755 "$out/$b" "$cache/bin/.$b.new"
    mv "$cache/bin/.$b.new" "$cache/bin/$b"
done
log "cached in $cache/bin"
echo "$cache/bin"
