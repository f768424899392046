"""Post-copy task (stdlib only): make the new project a git repository with a first commit.

Copier runs it in the rendered project with ``--trust``; ``copier update`` needs the project
under git, so doing it here lets an update work at once. A project rendered inside an
existing repository is left for that repository's owner to commit.

    python hooks/post_copy.py

The next steps are copier's message after the copy (``_message_after_copy`` in copier.yml).
"""

from __future__ import annotations

import shutil
import subprocess
import sys


def git(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], capture_output=True, text=True, check=False)


def main(argv: list[str]) -> int:
    if shutil.which("git") is None:
        print("post-copy: git is not installed; skipping `git init` (copier update needs a git repository)")
    elif git("rev-parse", "--is-inside-work-tree").stdout.strip() == "true":
        print("post-copy: already inside a git repository; not creating another one")
    else:
        steps = [
            ("init", "-q"),
            ("add", "-A"),
            (
                "-c",
                "user.name=torchfeed",
                "-c",
                "user.email=torchfeed@localhost",
                "commit",
                "-q",
                "-m",
                "Project rendered by torchfeed",
            ),
        ]
        for step in steps:
            result = git(*step)
            if result.returncode != 0:
                print(f"post-copy: git {' '.join(step)} failed: {result.stderr.strip()}", file=sys.stderr)
                return result.returncode
        print("post-copy: created a git repository with a first commit")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
