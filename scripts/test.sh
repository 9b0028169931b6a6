#!/usr/bin/env bash
# The whole test suite: installs what it needs, lints, checks the layering, runs every test.
# As root (CI) the kernel tests run on real runc containers; with CI set they may not skip.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# The real-node tier builds Kubernetes 1.37 from Go modules with this machine's Go 1.26
# (/usr/local/go): a non-login shell may not have it on its PATH, and Debian's older
# golang-go (/usr/bin/go, installed by the 1.20 stack's build) must not come first.
if [ -x /usr/local/go/bin/go ]; then
  export PATH="/usr/local/go/bin:$PATH"
fi
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/lint-imports
exec .venv/bin/pytest -p no:cacheprovider "$@"
