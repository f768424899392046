#!/usr/bin/env bash
# The main job: render a project with the default answers into a scratch folder, make its
# sample data, benchmark the loader, train briefly.   bash scripts/demo.sh [DEST]
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$repo/scripts/bootstrap.sh"
dest="$(realpath -m "${1:-$repo/build/demo}")"
rm -rf "$dest"
set -x
copier copy --defaults --trust --vcs-ref HEAD "$repo" "$dest"
cd "$dest"
export PYTHONPATH="$dest/src"
python -m my_training sample-data
python -m my_training bench --budget-s 30
python -m my_training train train.epochs=2
cat runs/default/bench/bench.md
tail -n 2 runs/default/metrics.jsonl
