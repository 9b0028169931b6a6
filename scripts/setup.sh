#!/usr/bin/env bash
# Installs what gpu-hotmount needs on this machine: Debian packages (as root) and a venv.
# Sourced by test.sh and demo.sh; safe to run again (it installs only what is missing).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

SYSTEM_PACKAGES=(runc containerd busybox-static util-linux bpftool python3-venv)
# The real-node tier (tests/k8s): etcd, CNI plugins, kube-proxy's iptables, gcc for the
# fake libnvidia-ml; Kubernetes itself is built from Debian's source by the tier
# (HOTMOUNT_K8S_VERSION=1.37: from Go modules, runc with libseccomp-dev and pkg-config).
SYSTEM_PACKAGES+=(etcd-server containernetworking-plugins iptables conntrack iproute2 gcc libc6-dev libseccomp-dev pkg-config)
# The agent image without Docker (scripts/build-image.sh): a Debian rootfs by mmdebstrap.
SYSTEM_PACKAGES+=(mmdebstrap)
# promtool, from Prometheus' own package: checks and unit-tests the chart's alerts
# (tests/deploy/test_monitoring.py). The package brings the server too: without systemd
# (CI, these VMs) nothing starts it; on a systemd host its unit starts on :9090.
SYSTEM_PACKAGES+=(prometheus)
# Debian's kubectl, unless one is installed already (another kubectl owns the same path).
command -v kubectl >/dev/null || SYSTEM_PACKAGES+=(kubernetes-client)
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  missing=()
  for pkg in "${SYSTEM_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "ok installed" || missing+=("$pkg")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    echo "setup: installing ${missing[*]}" >&2
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  fi
else
  echo "setup: not root: skipping system packages (${SYSTEM_PACKAGES[*]}); kernel tests will skip" >&2
fi

PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
log=$(mktemp)
if ! { .venv/bin/python -m pip install -q --upgrade pip && .venv/bin/python -m pip install -q -e '.[dev]'; } >"$log" 2>&1; then
  cat "$log" >&2; rm -f "$log"; exit 1
fi
rm -f "$log"
