#!/usr/bin/env bash
# The whole test suite: installs what it needs, lints, checks the layering and the types
# (mypy, strict on hotmount and agent), runs every test.
# As root (CI) the kernel tests run on real runc containers; with CI set they may not skip.
#
#   scripts/test.sh              the whole suite, in lanes (below), with a time report
#   scripts/test.sh ARGS...      one pytest run of ARGS (paths, -k, -x ...), no lanes
#
# The whole suite runs in three lanes, so that the two cores are busy while tests wait:
# - the real-node tier's cold builds (tests/k8s/node/prebuild.sh), from the start;
# - the chain: the real-node tier (tests/k8s), from the start too (its fixtures wait on
#   the builds' locks), then the kernel tests (tests/kernel). Builds, tier and kernel are
#   the longest chain, so they run at normal priority; their logs are printed at the end;
# - the tests that mostly wait on processes (tests/agent, cli, deploy, unit) in
#   pytest-xdist workers at a lower priority (nice 5), from the start: many small tests
#   that fill whatever the chain leaves idle.
# Processes side by side never share a port block or a routing table: the workers are
# slots 0..N-1, the chain slot 11 (tests/support/slots.py).
# Environment: HOTMOUNT_TEST_WORKERS (the workers, default 4: two cores, mostly idle);
# HOTMOUNT_TEST_RESULTS (JUnit XML and the lanes' logs; default a new temporary folder).
set -euo pipefail
cd "$(dirname "$0")/.."
started=$SECONDS
bash scripts/setup.sh
# These machines set PYTHONDONTWRITEBYTECODE, so nothing caches the project's bytecode: every
# agent, nvcli and runner process the tests start (hundreds) would compile its ~200 modules
# again, about 0.8 CPU-s each. Compiled once here, in seconds; an edited file's stale entry
# is ignored by Python (its mtime no longer matches).
.venv/bin/python -m compileall -q -j 0 hotmount agent cli tests bench >/dev/null
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
  .venv/bin/mypy
  exec .venv/bin/pytest -p no:cacheprovider "$@"
fi

results=${HOTMOUNT_TEST_RESULTS:-$(mktemp -d /tmp/gpu-hotmount-test.XXXXXX)}
mkdir -p "$results"
prebuild=
if [ "$(id -u)" = 0 ]; then
  bash tests/k8s/node/prebuild.sh >"$results/prebuild.log" 2>&1 &
  prebuild=$!
fi
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/lint-imports
# mypy's cold run costs about a minute of CPU: beside the lanes, not before them.
.venv/bin/mypy >"$results/mypy.log" 2>&1 &
mypy=$!
setup_seconds=$((SECONDS - started))

status=0
lanes_start=$SECONDS
# The chain: the real-node tier (its fixtures wait on the cold builds' locks), then the
# kernel tests. Kernel tests first, inside the builds' wait, was tried (run5 of issue 39):
# on two cores they took the builds' CPU, which finished 54% later, and the run with them.
(
  export HOTMOUNT_TEST_SLOT=11
  rc=0
  .venv/bin/pytest -p no:cacheprovider --durations=20 --junitxml="$results/tier.xml" \
    tests/k8s >"$results/tier.log" 2>&1 || rc=$?
  echo "$rc $((SECONDS - lanes_start))" >"$results/tier.status"
  rc=0
  .venv/bin/pytest -p no:cacheprovider --durations=20 --junitxml="$results/kernel.xml" \
    tests/kernel >"$results/kernel.log" 2>&1 || rc=$?
  echo "$rc $((SECONDS - lanes_start))" >"$results/kernel.status"
) &
chain=$!
nice -n 5 .venv/bin/pytest -p no:cacheprovider -n "${HOTMOUNT_TEST_WORKERS:-4}" --dist worksteal \
  --durations=30 --junitxml="$results/parallel.xml" \
  tests/agent tests/cli tests/deploy tests/unit || status=$?
parallel_seconds=$((SECONDS - lanes_start))
wait "$chain" || true
read -r tier_status tier_seconds <"$results/tier.status" || tier_status=1
read -r kernel_status kernel_seconds <"$results/kernel.status" || kernel_status=1
echo "--- the real-node tier (tests/k8s), run beside the workers:"
cat "$results/tier.log" || true
echo "--- the kernel tests (tests/kernel), after the tier, beside the workers:"
cat "$results/kernel.log" || true
[ "$tier_status" = 0 ] || status=$tier_status
[ "$kernel_status" = 0 ] || status=$kernel_status
mypy_status=0
wait "$mypy" || mypy_status=$?
echo "--- mypy (strict on hotmount and agent), run beside the lanes:"
cat "$results/mypy.log" || true
[ "$mypy_status" = 0 ] || status=$mypy_status
if [ -n "$prebuild" ]; then
  wait "$prebuild" || true
  echo "--- its builds (tests/k8s/node/prebuild.sh, from the start):"
  grep '^prebuild:' "$results/prebuild.log" || true
fi
echo "--- wall time: setup and lint ${setup_seconds}s; then side by side: workers" \
  "${parallel_seconds}s, the tier ended ${tier_seconds:-?}s in and the kernel tests" \
  "${kernel_seconds:-?}s in; total $((SECONDS - started))s"
reports=("$results"/parallel.xml "$results"/tier.xml "$results"/kernel.xml)
.venv/bin/python scripts/test_times.py "${reports[@]}" || status=1
exit "$status"
