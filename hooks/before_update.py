"""Before `copier update` changes anything: refuse to delete a file the user changed.

Copier deletes a file that the project's old answers rendered and its new ones do not (``copier
update -d data_source=stream`` on a folder project drops ``data/folder.py`` and its tests) with
no word, whatever the user wrote in it. Copier runs this first, in the project, with the
template's path and the answers given on the command line:

    python hooks/before_update.py TEMPLATE_DIR '{"data_source": "stream"}'

It lists the files the old answers render and the new ones do not (file names carry their
conditions, ``_exclude`` in copier.yml too), and stops the update (exit 1, nothing changed yet)
when one of them differs from what the last copy or update wrote (the project's last commit of
``.copier-answers.yml``), naming each and what to do. A changed ``data_format`` in a project
whose model.py and task.py are the user's (they are written for one sample format) stops it too;
a changed source reminds the user that configs/default.yaml, theirs, keeps its data.root.
Answers changed at copier's prompt (not with ``-d``) are not seen here. Runs under copier's Python: the standard
library and what copier itself installs (Jinja2, PyYAML).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import jinja2
import yaml

ANSWERS = ".copier-answers.yml"


def rendered(template: Path, answers: dict, exclude: list[str]) -> set[str]:
    """The paths (relative to the project) a render with ``answers`` writes."""
    env = jinja2.Environment(undefined=jinja2.ChainableUndefined)
    root = template / "template"
    excluded = {env.from_string(p).render(answers).strip() for p in exclude}
    paths = set()
    for path in root.rglob("*"):
        if not path.is_file():
            continue
        parts = [env.from_string(part).render(answers) for part in path.relative_to(root).parts]
        if not all(parts) or any(part in excluded for part in parts):
            continue
        rel = "/".join(parts)
        paths.add(rel.removesuffix(".jinja"))
    return paths


def git(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], capture_output=True, check=False)


def changed_since_last_render(rel: str) -> bool:
    """Whether ``rel`` differs from its content in the last commit of the answers file (a copy or update)."""
    last = git("log", "-1", "--format=%H", "--", ANSWERS).stdout.decode().strip()
    if not last:
        return True  # no record of what the template wrote: count it as the user's
    before = git("show", f"{last}:./{rel}")  # ./: relative to here, the project (it may sit in a larger repository)
    return before.returncode != 0 or before.stdout != Path(rel).read_bytes()


def typed(settings: dict, given: dict) -> dict:
    """The answers given on the command line, as the types their questions declare (copier's ``-d`` gives strings)."""
    cast = {"int": int, "float": float, "bool": lambda v: str(v).lower() in ("1", "true", "yes", "y", "on")}
    out = {}
    for name, value in given.items():
        kind = (settings.get(name) or {}).get("type", "str") if isinstance(settings.get(name), dict) else "str"
        try:
            out[name] = cast[kind](value) if kind in cast and isinstance(value, str) else value
        except ValueError:
            out[name] = value  # copier refuses it at its own check, naming the question
    return out


def main(argv: list[str]) -> int:
    template, given = Path(argv[0]), json.loads(argv[1]) if len(argv) > 1 else {}
    settings = yaml.safe_load((template / "copier.yml").read_text(encoding="utf-8"))
    old = yaml.safe_load(Path(ANSWERS).read_text(encoding="utf-8")) or {}
    given = typed(settings, given)
    changed = {k: v for k, v in given.items() if old.get(k) != v}
    if not changed:
        return 0  # the same answers select the same files
    answers = ", ".join(f"{k}={v}" for k, v in changed.items())
    if "data_format" in changed and "torchfeed_ownership" in old:
        print(
            f"error: {answers} changes what a sample is, and model.py and task.py (yours: an update leaves them "
            "as they are) are written for the old one; render a new project with it (`copier copy ... -d "
            f"data_format={changed['data_format']}`) and bring your code across",
            file=sys.stderr,
        )
        return 1
    defaults = {
        name: spec.get("default")
        for name, spec in settings.items()
        if not name.startswith("_") and isinstance(spec, dict) and "{" not in str(spec.get("default"))
    }
    exclude = [p for p in settings.get("_exclude", []) if "{%" in p]
    old, new = {**defaults, **old}, {**defaults, **old, **given}
    gone = sorted(rendered(template, old, exclude) - rendered(template, new, exclude))
    kept = [rel for rel in gone if Path(rel).is_file() and changed_since_last_render(rel)]
    if kept:
        print(
            f"error: with {answers} this project no longer has {', '.join(kept)}, which you changed since the "
            "last copy or update, and the update would delete it; move what you wrote to a file of your own "
            "(or delete the file yourself), commit, and update again",
            file=sys.stderr,
        )
        return 1
    if {"data_source", "stream_backend"} & set(changed) and "torchfeed_ownership" in old:
        print(
            f"note: {answers}: configs/default.yaml is yours and the update leaves it as it is; set its "
            "data.root (and any key of the old source) for the new source",
            file=sys.stderr,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
