#!/usr/bin/env bash
# Create (or refresh) .venv with requirements-dev.txt; sourced by demo.sh and test.sh.
# Re-installs only when requirements-dev.txt changed since the last successful install.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${TORCHFEED_VENV:-$repo/.venv}"
python="${PYTHON:-python3}"
if [ ! -x "$venv/bin/python" ]; then
    echo "bootstrap: creating $venv"
    "$python" -m venv "$venv"
fi
stamp="$venv/.requirements-dev.sha256"
want="$(sha256sum "$repo/requirements-dev.txt" | cut -d' ' -f1)"
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    echo "bootstrap: installing requirements-dev.txt into $venv (torch takes a minute or two)"
    # pip byte-compiles what it installs one file at a time (45 s of the 100 here); compileall does it
    # on every core. Some packages ship files that do not compile (their tests' fixtures): pip skips
    # them as compileall does, which then exits 1.
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-compile -r "$repo/requirements-dev.txt"
    site="$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')"
    "$venv/bin/python" -m compileall -qq -j 0 "$site" || true
    echo "$want" > "$stamp"
fi
export PATH="$venv/bin:$PATH"
export VIRTUAL_ENV="$venv"
