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
# Two workers: the rendered projects' suites spend much of their time starting processes; the real-Slurm
# tests (one cluster) stay together on one of them (--dist loadgroup).
python -m pytest tests -n "${TEST_WORKERS:-2}" --dist loadgroup --durations=40 "$@"
