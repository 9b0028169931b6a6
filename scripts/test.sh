#!/usr/bin/env bash
# The whole test suite: installs what it needs, lints, checks the layering, runs every test.
# As root (CI) the kernel tests run on real runc containers; with CI set they may not skip.
#
#   scripts/test.sh              the whole suite, in two phases (below), with a time report
#   scripts/test.sh ARGS...      one pytest run of ARGS (paths, -k, -x ...), no phases
#
# Phase 1 runs the tests that mostly wait on processes (tests/agent, cli, deploy, unit) in
# pytest-xdist workers while the real-node tier's cold builds (tests/k8s/node/prebuild.sh)
# fill the idle cores at the lowest priority. Phase 2 runs the real-node tier and then the
# kernel tests in one process, in order: both own the node's kernel state while they run.
# Environment: HOTMOUNT_TEST_WORKERS (phase 1's workers, default 4: two cores, mostly idle);
# HOTMOUNT_TEST_RESULTS (where JUnit XML and the prebuild's log go, default a temp dir).
set -euo pipefail
cd "$(dirname "$0")/.."
started=$SECONDS
bash scripts/setup.sh
# The real-node tier builds Kubernetes 1.37 from Go modules with this machine's Go 1.26
# (/usr/local/go): a non-login shell may not have it on its PATH, and Debian's older
# golang-go (/usr/bin/go, installed by the 1.20 stack's build) must not come first.
if [ -x /usr/local/go/bin/go ]; then
  export PATH="/usr/local/go/bin:$PATH"
fi
if [ $# -gt 0 ]; then
  .venv/bin/ruff check .
  .venv/bin/ruff format --check .
  .venv/bin/lint-imports
  exec .venv/bin/pytest -p no:cacheprovider "$@"
fi

results=${HOTMOUNT_TEST_RESULTS:-$(mktemp -d /tmp/gpu-hotmount-test.XXXXXX)}
mkdir -p "$results"
prebuild=
if [ "$(id -u)" = 0 ]; then
  nice -n 19 bash tests/k8s/node/prebuild.sh >"$results/prebuild.log" 2>&1 &
  prebuild=$!
fi
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/lint-imports
setup_seconds=$((SECONDS - started))

status=0
phase1_start=$SECONDS
.venv/bin/pytest -p no:cacheprovider -n "${HOTMOUNT_TEST_WORKERS:-4}" --dist worksteal \
  --durations=30 --junitxml="$results/parallel.xml" \
  tests/agent tests/cli tests/deploy tests/unit || status=$?
phase1_seconds=$((SECONDS - phase1_start))
phase2_start=$SECONDS
.venv/bin/pytest -p no:cacheprovider --durations=30 --junitxml="$results/serial.xml" \
  tests/k8s tests/kernel || status=$?
phase2_seconds=$((SECONDS - phase2_start))
if [ -n "$prebuild" ]; then
  wait "$prebuild" || true
  echo "--- the tier's builds (tests/k8s/node/prebuild.sh, in the background from the start):"
  grep '^prebuild:' "$results/prebuild.log" || true
fi
echo "--- wall time: setup and lint ${setup_seconds}s; phase 1 (parallel) ${phase1_seconds}s;" \
  "phase 2 (tier, kernel) ${phase2_seconds}s; total $((SECONDS - started))s"
reports=("$results"/parallel.xml "$results"/serial.xml)
.venv/bin/python scripts/test_times.py "${reports[@]}" || status=1
exit "$status"
