#!/usr/bin/env bash
# Builds, ahead of the real-node tier, what a new machine lacks and the tier would
# otherwise build in its fixtures: the 1.37 stack (build-go.sh: Kubernetes, etcd,
# containerd, runc), the DRA example driver, NVIDIA's device plugin and the notebook
# image's Debian base. scripts/test.sh starts it in the background at the start of a
# run, beside the tests that mostly wait, so the tier need not build when it starts.
# Every piece is cached by its inputs under a lock (see each build script): a fixture
# that asks for one still under way waits for it, and then finds it built; one that
# failed here is built again by its fixture, which reports the error itself.
#   usage: prebuild.sh      (as root; progress and timings on stderr)
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../../.." && pwd)"
cd "$repo"
status=0
step() {
    local name=$1 start=$SECONDS; shift
    if "$@" >/dev/null; then
        echo "prebuild: $name done in $((SECONDS - start)) s" >&2
    else
        echo "prebuild: $name FAILED after $((SECONDS - start)) s (its fixture builds it again)" >&2
        status=1
    fi
}
if [ "${HOTMOUNT_K8S_VERSION:-1.37}" = 1.37 ]; then
    step "kubernetes, etcd, containerd, runc" bash "$here/build-go.sh"
    step "DRA example driver" bash "$here/build-dra-driver.sh"
    step "NVIDIA device plugin" bash "$here/nvidia-device-plugin/build.sh"
fi
step "notebook base image" "$repo/.venv/bin/python" -c \
    'from tests.k8s.notebook_image import cached_base; cached_base()'
exit $status
