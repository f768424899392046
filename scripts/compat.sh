#!/usr/bin/env bash
# Compatibility check: does the rendered project's fast test suite pass on the oldest and the
# newest torch the project claims?
#   bash scripts/compat.sh [--keep] [pytest args...]
# Renders the template's default project from this working tree (uncommitted changes included,
# as scripts/demo.sh does) into a scratch folder; then, for each environment in ENVS below, creates
# (or reuses: keyed by a hash of the pins and the Python version) a venv under
# ${TORCHFEED_COMPAT_DIR:-.compat}, installs the pins and then the project as its README says
# (pip install -e ".[dev]"), checks that the pins survived, and runs the project's fast suite
# (pytest -q -m "not slow", extra arguments appended) under a 1800 s timeout. Prints a summary
# table at the end; exits non-zero if any environment fails.
#   --keep                     keep the scratch folder (the rendered project and each pytest log)
#   TORCHFEED_COMPAT_DIR       where the venvs live (default .compat/ in the repo, git-ignored by
#                              the .gitignore this script writes inside it)
#   TORCHFEED_COMPAT_ONLY      run only these environments (space-separated names, e.g. "oldest")
#   TORCHFEED_COMPAT_TIMEOUT   the suite's timeout in seconds (default 1800)
#   PYTHON                     the interpreter the venvs are made from (default python3)
# The first run downloads the CUDA builds of torch (several GB per environment); later runs reuse
# the venvs and only reinstall the rendered project. Delete a venv's folder to rebuild it.
set -euo pipefail

# name|pins (pip requirement specifiers, space-separated). torch>=2.5 and torchvision>=0.20 are the
# rendered pyproject's lower bounds; the newest is the newest release checked.
ENVS=(
    "oldest|torch==2.5.1 torchvision==0.20.1"
    "newest|torch==2.15.0 torchvision==0.29.2"
)

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
keep=0
if [ "${1:-}" = "--keep" ]; then
    keep=1
    shift
fi
case "${1:-}" in
    -h | --help)
        sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'
        exit 0
        ;;
esac
pytest_args=("$@")
compat_dir="$(realpath -m "${TORCHFEED_COMPAT_DIR:-$repo/.compat}")"
suite_timeout="${TORCHFEED_COMPAT_TIMEOUT:-1800}"
python="${PYTHON:-python3}"
# The machine's pip config may cap torch with a constraints file; an empty constraints file in its
# place lifts the cap for these installs only (an empty PIP_CONSTRAINT= does not, with pip 23).
pip_env=(env PIP_CONSTRAINT=/dev/null PIP_DISABLE_PIP_VERSION_CHECK=1)

source "$repo/scripts/bootstrap.sh" # the dev venv's copier
mkdir -p "$compat_dir"
# Ignored by git whatever the repo's .gitignore says: copier's render of a dirty working tree
# stages every unignored file, which would include the venvs.
[ -f "$compat_dir/.gitignore" ] || echo '*' >"$compat_dir/.gitignore"

scratch="$(mktemp -d "${TMPDIR:-/tmp}/torchfeed-compat.XXXXXX")"
cleanup() {
    if [ "$keep" = 1 ]; then
        echo "compat: kept $scratch (project/, logs/)"
    else
        rm -rf "$scratch"
    fi
}
trap cleanup EXIT
dest="$scratch/project"
logs="$scratch/logs"
mkdir -p "$logs"

echo "compat: rendering the default project into $dest"
copier copy --defaults --trust --vcs-ref HEAD "$repo" "$dest" >"$logs/render.log" 2>&1 || {
    cat "$logs/render.log"
    echo "compat: rendering failed" >&2
    exit 1
}

# The version of each name==version pin in $1 that is not installed in venv $2 ("" when all are).
wrong_pins() {
    "$2/bin/python" - "$1" <<'EOF'
import sys
from importlib.metadata import PackageNotFoundError, version
wrong = []
for pin in sys.argv[1].split():
    if "==" not in pin:
        continue
    name, want = pin.split("==", 1)
    try:
        have = version(name)
    except PackageNotFoundError:
        have = "none"
    if have.split("+")[0] != want:
        wrong.append(f"{name}=={want} (installed: {have})")
print(", ".join(wrong))
EOF
}

versions() { # torch torchvision torchdata of venv $1, "-" for one that is missing
    "$1/bin/python" -c '
from importlib.metadata import version
for name in ("torch", "torchvision", "torchdata"):
    try:
        print(version(name), end=" ")
    except Exception:
        print("-", end=" ")
' 2>/dev/null || echo "- - -"
}

rows=()
failed=0
for spec in "${ENVS[@]}"; do
    name="${spec%%|*}"
    pins="${spec#*|}"
    if [ -n "${TORCHFEED_COMPAT_ONLY:-}" ] && [[ " $TORCHFEED_COMPAT_ONLY " != *" $name "* ]]; then
        continue
    fi
    key="$(printf '%s\n%s\n' "$pins" "$("$python" -c 'import sys; print(sys.version)')" | sha256sum | cut -c1-12)"
    venv="$compat_dir/$name-$key"
    log="$logs/$name.log"
    echo
    echo "=== compat: $name ($pins) in $venv"
    status=ok
    setup_start=$SECONDS
    if [ ! -f "$venv/.compat-pins-ok" ]; then
        rm -rf "$venv"
        echo "compat: $name: creating the venv and installing $pins (downloads GBs the first time)"
        "$python" -m venv "$venv"
        # shellcheck disable=SC2086  # the pins are words
        if ! "${pip_env[@]}" "$venv/bin/python" -m pip install --progress-bar off $pins >"$venv/.compat-build.log" 2>&1; then
            tail -n 30 "$venv/.compat-build.log"
            status="pins-install-failed"
        else
            echo "$pins" >"$venv/.compat-pins-ok"
            echo "compat: $name: pins installed in $((SECONDS - setup_start)) s"
        fi
    else
        echo "compat: $name: reusing the venv"
    fi
    if [ "$status" = ok ]; then
        echo "compat: $name: pip install -e \"$dest[dev]\""
        if ! "${pip_env[@]}" "$venv/bin/python" -m pip install --progress-bar off -e "$dest[dev]" >"$logs/$name-install.log" 2>&1; then
            tail -n 30 "$logs/$name-install.log"
            status="project-install-failed"
        fi
    fi
    if [ "$status" = ok ]; then
        wrong="$(wrong_pins "$pins" "$venv")"
        if [ -n "$wrong" ]; then
            echo "compat: $name: the project's install did not keep the pins: $wrong" >&2
            status="pins-not-kept"
            rm -f "$venv/.compat-pins-ok" # the next run rebuilds this venv
        fi
        echo "compat: $name: torch $("$venv/bin/python" -c 'import torch; print(torch.__version__)' 2>&1 | tail -n 1)"
    fi
    setup_s=$((SECONDS - setup_start))

    passed=- nfailed=- skipped=- test_s=-
    if [ "$status" = ok ]; then
        echo "compat: $name: python -m pytest -q -m \"not slow\" -p no:cacheprovider ${pytest_args[*]:-} (timeout ${suite_timeout}s)"
        test_start=$SECONDS
        set +e
        (
            cd "$dest"
            unset PYTHONPATH
            export VIRTUAL_ENV="$venv" PATH="$venv/bin:$PATH"
            timeout -k 30 "$suite_timeout" python -m pytest -q -m "not slow" -p no:cacheprovider "${pytest_args[@]}"
        ) 2>&1 | tee "$log"
        rc=${PIPESTATUS[0]}
        set -e
        test_s=$((SECONDS - test_start))
        summary="$(grep -E '^(=+ )?[0-9]+ [a-z]+.* in [0-9.]+s' "$log" | tail -n 1 || true)"
        count() { { grep -oE "[0-9]+ $1" <<<"$summary" || true; } | awk '{s += $1} END {print s + 0}'; }
        passed="$(count passed)"
        nfailed=$(($(count failed) + $(count 'errors?')))
        skipped="$(count skipped)"
        if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
            status="timeout"
        elif [ "$rc" != 0 ]; then
            status="pytest-exit-$rc"
        fi
    fi
    [ "$status" = ok ] || failed=1
    read -r v_torch v_vision v_data <<<"$(versions "$venv")"
    rows+=("$name|$status|$v_torch|$v_vision|$v_data|$passed|$nfailed|$skipped|$setup_s|$test_s")
done

echo
echo "=== compat summary (failed counts errors too; setup: venv + installs, test: the suite)"
{
    echo "environment|status|torch|torchvision|torchdata|passed|failed|skipped|setup s|test s"
    printf '%s\n' "${rows[@]}"
} | column -t -s '|'
exit "$failed"
