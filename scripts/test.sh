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
# Two workers (the cores). Tests that share a render, a release's update or the real-Slurm cluster
# run on one worker, the longest first (tests/conftest.py: work_unit, LONGEST_FIRST). The suites keep
# both cores busy: three workers took 29:07 on 2 cores, two 26:37.
python -m pytest tests -n "${TEST_WORKERS:-2}" --dist loadscope --durations=40 "$@"
