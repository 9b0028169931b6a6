#!/usr/bin/env bash
# The whole test suite: installs what it needs, lints, checks the layering, runs every test.
# As root (CI) the kernel tests run on real runc containers; with CI set they may not skip.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/lint-imports
exec .venv/bin/pytest -p no:cacheprovider "$@"
