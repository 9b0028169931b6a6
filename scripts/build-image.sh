#!/usr/bin/env bash
# Build the agent image without a Docker daemon.
#
#   scripts/build-image.sh [OUT]
#
# Writes an OCI image archive (a tar of an OCI image layout) of the image
# gpu-hotmount/agent:<version>, <version> from pyproject.toml, to OUT (default
# dist/gpu-hotmount-agent-<version>.oci.tar in the checkout), and prints OUT's absolute
# path as the only line on stdout; progress goes to stderr. Load it with
#   ctr -n k8s.io images import OUT
# which names it docker.io/gpu-hotmount/agent:<version> (the name a pod's
# `image: gpu-hotmount/agent:<version>` resolves to; use imagePullPolicy: Never).
#
# What it does, as deploy/Dockerfile does it with Docker: a Debian bookworm rootfs from
# mmdebstrap (--variant=minbase, python3, python3-venv; no apt lists, docs, man pages or
# locales), cached under $HOTMOUNT_IMAGE_CACHE keyed by its inputs; the project's wheel
# (pip wheel --no-deps); deploy/install-agent.sh run in a chroot of that rootfs; then
# scripts/oci_archive.py packs the rootfs as one gzip layer with the Dockerfile's
# Entrypoint, Env, User and port.
#
# Needs root, mmdebstrap, util-linux (unshare, flock) and python3 (scripts/setup.sh
# installs them), and the network: the Debian mirror (when the base is not cached) and
# the Python package index (the agent's dependencies).
#
# Environment (all optional):
#   HOTMOUNT_IMAGE_NAME             repository; default gpu-hotmount/agent (tag: the version)
#   HOTMOUNT_IMAGE_CACHE            default /var/cache/gpu-hotmount: base rootfs tarballs, pip cache
#   HOTMOUNT_BASE_MAX_AGE_DAYS      rebuild a cached base older than this; default 7 (updates)
#   HOTMOUNT_DEBIAN_MIRROR          default http://deb.debian.org/debian
#   HOTMOUNT_DEBIAN_SECURITY_MIRROR default http://deb.debian.org/debian-security
#   SOURCE_DATE_EPOCH               image creation time, and every mtime is clamped to it;
#                                   default: the time of the checkout's HEAD commit
#   PYTHON                          builds the wheel; default .venv/bin/python, else python3
#   PIP_INDEX_URL, PIP_EXTRA_INDEX_URL, PIP_TRUSTED_HOST, http_proxy, https_proxy, no_proxy
#                                   passed on to pip in the chroot
#   PIP_CERT (else REQUESTS_CA_BUNDLE, else SSL_CERT_FILE)
#                                   a CA bundle file pip in the chroot trusts (copied in
#                                   for the build only; not in the image)
#
# Exit status: 0 built; 1 the build failed; 2 usage; 3 cannot build here (not root, a
# tool missing); 4 the Debian mirror or the Python package index is unreachable.
set -euo pipefail

EXIT_FAILED=1 EXIT_USAGE=2 EXIT_CANNOT=3 EXIT_OFFLINE=4
SUITE=bookworm
BASE_PACKAGES=python3,python3-venv
BASE_RECIPE=2  # bump when the base's recipe below changes in a way the key does not see
PREFIX=/opt/gpu-hotmount
LIBDIR=/usr/local/lib/gpu-hotmount

log() { echo "build-image: [${SECONDS}s] $*" >&2; }
die() { local code=$1; shift; log "$*"; exit "$code"; }

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
case "${1:-}" in -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;; esac
[ $# -le 1 ] || die $EXIT_USAGE "usage: scripts/build-image.sh [OUT]"

[ "$(id -u)" = 0 ] || die $EXIT_CANNOT "needs root (mmdebstrap and chroot); run it as root"
for tool in mmdebstrap unshare flock chroot python3 tar; do
  command -v "$tool" >/dev/null || die $EXIT_CANNOT "needs $tool: run scripts/setup.sh as root"
done

version=$(python3 -c 'import sys, tomllib; print(tomllib.load(open(sys.argv[1], "rb"))["project"]["version"])' \
  "$repo/pyproject.toml")
name="${HOTMOUNT_IMAGE_NAME:-gpu-hotmount/agent}:$version"
out=${1:-$repo/dist/gpu-hotmount-agent-$version.oci.tar}
mkdir -p "$(dirname "$out")"
out="$(cd "$(dirname "$out")" && pwd)/$(basename "$out")"
cache=${HOTMOUNT_IMAGE_CACHE:-/var/cache/gpu-hotmount}
mirror=${HOTMOUNT_DEBIAN_MIRROR:-http://deb.debian.org/debian}
security=${HOTMOUNT_DEBIAN_SECURITY_MIRROR:-http://deb.debian.org/debian-security}
max_age=${HOTMOUNT_BASE_MAX_AGE_DAYS:-7}
epoch=${SOURCE_DATE_EPOCH:-$(git -C "$repo" log -1 --format=%ct 2>/dev/null || date +%s)}
arch=$(dpkg --print-architecture)
python=${PYTHON:-}
if [ -z "$python" ]; then
  if [ -x "$repo/.venv/bin/python" ]; then python=$repo/.venv/bin/python; else python=python3; fi
fi

reachable() {  # URL: can it be fetched (proxies from the environment apply)?
  python3 - "$1" <<'EOF'
import sys, urllib.request
try:
    urllib.request.urlopen(urllib.request.Request(sys.argv[1], method="HEAD"), timeout=20).close()
except Exception as error:
    sys.exit(f"{sys.argv[1]}: {error}")
EOF
}

work=$(mktemp -d "${TMPDIR:-/var/tmp}/gpu-hotmount-image.XXXXXX")
trap 'rm -rf "$work"' EXIT
mkdir -p "$cache/pip"

# --- The base rootfs: Debian's own packages, cached by the inputs that make it. ---
base_args=(
  --variant=minbase --include="$BASE_PACKAGES" --architectures="$arch"
  --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr
  --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-include=/usr/share/doc/*/copyright'
  --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/info/*'
  --dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-include=/usr/share/locale/locale.alias'
  --dpkgopt='path-exclude=/usr/share/lintian/*'
  --customize-hook='cd "$1" && rm -rf var/log/apt/* var/log/dpkg.log var/log/alternatives.log'
  --customize-hook='cd "$1" && rm -rf var/cache/debconf/*-old var/lib/dpkg/*-old var/cache/ldconfig/aux-cache'
  # what path-exclude leaves: links, empty directories, install-info's index, the host's name
  --customize-hook='cd "$1" && find usr/share/doc -mindepth 2 ! -type d ! -regex "usr/share/doc/[^/]*/copyright" -delete'
  --customize-hook='cd "$1" && for d in usr/share/doc usr/share/man usr/share/info; do
    [ ! -d "$d" ] || find "$d" -mindepth 1 -type d -empty -delete; done'
  --customize-hook='cd "$1" && rm -f usr/share/info/dir etc/hostname'
  "$SUITE" "@OUT@"
  "deb $mirror $SUITE main" "deb $mirror $SUITE-updates main" "deb $security $SUITE-security main"
)
key=$( { printf '%s\n' "$BASE_RECIPE" "$(mmdebstrap --version)" "${base_args[@]}"; } | sha256sum | cut -c1-16)
base=$cache/base-$SUITE-$arch-$key.tar
exec 9>"$cache/.lock"
flock 9  # one base build at a time; a second build waits and then finds it cached
if [ -f "$base" ] && [ -z "$(find "$base" -mtime +"$max_age")" ]; then
  log "base rootfs: cached $base"
else
  reachable "$mirror/dists/$SUITE/InRelease" >&2 || die $EXIT_OFFLINE "the Debian mirror is unreachable"
  log "base rootfs: mmdebstrap $SUITE (minbase, $BASE_PACKAGES) -> $base"
  partial=$cache/.partial-$(basename "$base")
  args=("${base_args[@]/#@OUT@/$partial}")
  if ! mmdebstrap "${args[@]}" >"$work/mmdebstrap.log" 2>&1; then
    tail -n 40 "$work/mmdebstrap.log" >&2
    rm -f "$partial"
    die $EXIT_FAILED "mmdebstrap failed"
  fi
  mv "$partial" "$base"
  # Bases of other inputs are stale now.
  find "$cache" -maxdepth 1 -name "base-$SUITE-$arch-*.tar" ! -name "$(basename "$base")" -delete
fi
flock -u 9

# --- The wheel, from a copy of the tree (setuptools writes build/ into its source). ---
index=${PIP_INDEX_URL:-https://pypi.org/simple}
reachable "${index%/}/pip/" >&2 || die $EXIT_OFFLINE "the Python package index is unreachable"
mkdir -p "$work/src" "$work/wheels"
if git -C "$repo" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  (cd "$repo" && git ls-files -z -co --exclude-standard | while IFS= read -r -d '' f; do
    [ -f "$f" ] && printf '%s\0' "$f"; done | tar --null -T - -cf -) | tar -C "$work/src" -xf -
else
  tar -C "$repo" --exclude=./.venv --exclude=./.git --exclude=./build --exclude=./dist -cf - . |
    tar -C "$work/src" -xf -
fi
if ! "$python" -m pip --version >/dev/null 2>&1; then
  "$python" -m venv "$work/wheel-env" && python=$work/wheel-env/bin/python
fi
log "wheel: pip wheel --no-deps"
if ! PIP_CACHE_DIR=$cache/pip "$python" -m pip wheel --quiet --no-deps --disable-pip-version-check \
  --wheel-dir "$work/wheels" "$work/src" >"$work/wheel.log" 2>&1; then
  tail -n 40 "$work/wheel.log" >&2
  die $EXIT_FAILED "pip wheel failed"
fi

# --- The agent, installed in a chroot by the Dockerfile's own script. ---
root=$work/rootfs
mkdir -p "$root"
tar -C "$root" --numeric-owner -xpf "$base"
install -d "$root$LIBDIR" "$root/tmp/wheels" "$root/var/cache/pip-build"
install -m 0755 "$repo/deploy/install-agent.sh" "$root$LIBDIR/install-agent.sh"
install -m 0644 "$repo/deploy/healthcheck.py" "$root$LIBDIR/healthcheck.py"
cp "$work"/wheels/gpu_hotmount-*.whl "$root/tmp/wheels/"
cp -L /etc/resolv.conf "$root/etc/resolv.conf"
image_path=$PREFIX/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
chroot_env=(env -i "PATH=$image_path" HOME=/root LANG=C.UTF-8 PYTHONDONTWRITEBYTECODE=1
  PYTHONUNBUFFERED=1 PIP_CACHE_DIR=/var/cache/pip-build PIP_ROOT_USER_ACTION=ignore
  SOURCE_DATE_EPOCH="$epoch")  # pip's .pyc files then hold source hashes, not install times
for var in PIP_INDEX_URL PIP_EXTRA_INDEX_URL PIP_TRUSTED_HOST http_proxy https_proxy no_proxy \
  HTTP_PROXY HTTPS_PROXY NO_PROXY; do
  [ -n "${!var:-}" ] && chroot_env+=("$var=${!var}")
done
# A CA bundle the host's pip trusts (a TLS-inspecting proxy's), for pip in the chroot too.
ca_bundle=${PIP_CERT:-${REQUESTS_CA_BUNDLE:-${SSL_CERT_FILE:-}}}
if [ -n "$ca_bundle" ] && [ -f "$ca_bundle" ]; then
  cp -L "$ca_bundle" "$root/tmp/pip-ca.pem"
  chroot_env+=(PIP_CERT=/tmp/pip-ca.pem)
fi
log "agent: install-agent.sh in a chroot"
# A private mount namespace: /proc, /dev and the pip cache vanish with it, whatever happens.
unshare --mount --propagation private -- "$BASH" -euc '
  root=$1; cache=$2; shift 2
  mount -t proc proc "$root/proc"
  mount --rbind /dev "$root/dev"
  mount --bind "$cache" "$root/var/cache/pip-build"
  chroot "$root" "$@" sh '"$LIBDIR"'/install-agent.sh /tmp/wheels '"$PREFIX"'
  chroot "$root" "$@" hotmount-agent --help >/dev/null
  chroot "$root" "$@" sh -c "command -v nsenter" >/dev/null
' build "$root" "$cache/pip" "${chroot_env[@]}" >&2 || die $EXIT_FAILED "installing the agent failed"
rm -rf "$root"/tmp/* "$root/etc/resolv.conf" "$root/root/.cache"
rmdir "$root/var/cache/pip-build"

# --- The archive. ---
cat >"$work/config.json" <<EOF
{
  "User": "0",
  "Env": [
    "PATH=$image_path",
    "LANG=C.UTF-8",
    "PYTHONDONTWRITEBYTECODE=1",
    "PYTHONUNBUFFERED=1",
    "NVIDIA_VISIBLE_DEVICES=all",
    "NVIDIA_DRIVER_CAPABILITIES=utility"
  ],
  "Entrypoint": ["hotmount-agent"],
  "ExposedPorts": {"8443/tcp": {}},
  "Labels": {
    "org.opencontainers.image.title": "gpu-hotmount agent",
    "org.opencontainers.image.version": "$version",
    "org.opencontainers.image.base.name": "debian:$SUITE (mmdebstrap minbase)"
  }
}
EOF
log "archive: $name -> $out"
python3 "$repo/scripts/oci_archive.py" --rootfs "$root" --name "$name" --config "$work/config.json" \
  --epoch "$epoch" --arch "$arch" --out "$out" >&2 || die $EXIT_FAILED "packing the archive failed"
echo "$out"
