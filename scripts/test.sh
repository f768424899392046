#!/usr/bin/env bash
# Every test: lint, then the template's tests (they render every answer combination and run
# each rendered project's own tests, the update path and the validators).
#   bash scripts/test.sh [pytest args]
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$repo/scripts/bootstrap.sh"
cd "$repo"
ruff check .
ruff format --check .
# Two workers: the rendered projects' suites spend much of their time starting processes. One real
# Slurm cluster runs at a time (tests/test_slurm.py takes a lock: xdist's loadgroup does not group
# tests under pytest 9).
python -m pytest tests -n "${TEST_WORKERS:-2}" --dist loadgroup --durations=40 "$@"
