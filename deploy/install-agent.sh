#!/bin/sh
# Install the agent from a directory holding the gpu-hotmount wheel into a new virtual
# environment: install-agent.sh WHEEL_DIR PREFIX. deploy/Dockerfile runs it, and so does
# tests/deploy/test_image.py, outside Docker, to check the image's install steps.
set -eu
wheels=$1
prefix=$2
"${PYTHON:-python3}" -m venv "$prefix"
set -- "$wheels"/gpu_hotmount-*.whl
[ $# -eq 1 ] && [ -f "$1" ] || { echo "install-agent: expected one gpu_hotmount wheel in $wheels" >&2; exit 1; }
"$prefix/bin/python" -m pip install --disable-pip-version-check --quiet "$1[agent,nvml]"
