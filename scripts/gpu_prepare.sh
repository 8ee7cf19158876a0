#!/usr/bin/env bash
# Fill .gpu/ (git-ignored) for scripts/gpu_check.sh: the shared wheels, data
# and device_env.sh (../shared/gpu/fetch_wheels.sh), plus pytest, which the
# GPU machine's python3 lacks. Run from the project root on a machine with pip.
# Usage: scripts/gpu_prepare.sh .gpu
set -euo pipefail
[ "${1:-}" = .gpu ] || { echo "usage: scripts/gpu_prepare.sh .gpu (fills .gpu/ for scripts/gpu_check.sh)" >&2; exit 2; }
cd "$(git rev-parse --show-toplevel)"
bash ../shared/gpu/fetch_wheels.sh > /dev/null
python3 -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux2014_x86_64 --platform any -d .gpu/wheels "pytest>=7,<9.2" 2>&1 | grep -v '^WARNING' || true
ls .gpu/wheels | grep -c whl | sed 's/^/wheels: /'
