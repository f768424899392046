"""Shared helpers of the template's own tests: render the template, run commands, copy the repo.

Every render goes through :func:`render`, which calls ``copier.run_copy`` on this working tree
at ``HEAD`` (copier then includes uncommitted changes and warns with ``DirtyLocalWarning``,
which pytest.ini ignores). Git runs with a fixed identity and without the developer's global
or system git config, so the tests behave the same on a bare CI machine.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import copier
import pytest
import yaml
from plumbum import local

REPO = Path(__file__).resolve().parents[1]
COPIER_YML = REPO / "copier.yml"

# Seconds a rendered project's whole test suite may take (the design wants it fast).
RENDERED_TESTS_TIMEOUT_S = int(os.environ.get("TORCHFEED_RENDERED_TESTS_TIMEOUT_S", "1200"))

GIT_IDENTITY = {
    "GIT_AUTHOR_NAME": "torchfeed tests",
    "GIT_AUTHOR_EMAIL": "tests@torchfeed.invalid",
    "GIT_COMMITTER_NAME": "torchfeed tests",
    "GIT_COMMITTER_EMAIL": "tests@torchfeed.invalid",
}

# Jinja left in a rendered file: an expression on a name ({{ package_name }}, {{ x | f }}) not
# preceded by "$" (GitHub Actions' ${{ ... }} is legitimate output), or a statement/comment tag.
JINJA_EXPR = re.compile(r"(?<!\$)\{\{-?\s*[A-Za-z_][\w.]*\s*(\|[^{}\n]*)?-?\}\}")
JINJA_TAG = re.compile(
    r"\{%-?\s*(if|elif|else|endif|for|endfor|set|endset|raw|endraw|include|import|from|macro|endmacro|"
    r"block|endblock|extends|filter|endfilter|with|endwith|yield)\b|\{#-?\s"
)
# Where a rendered project writes caches; never part of what copier rendered.
NOT_RENDERED = {".git", "__pycache__", ".pytest_cache", ".ruff_cache"}


def copier_questions() -> dict[str, dict[str, Any]]:
    """The questions of copier.yml (keys not starting with "_"), by name."""
    data = yaml.safe_load(COPIER_YML.read_text(encoding="utf-8"))
    return {k: v for k, v in data.items() if not k.startswith("_")}


def render(
    dst: Path | str,
    *,
    tasks: bool = False,
    src: Path | str = REPO,
    vcs_ref: str = "HEAD",
    pretend: bool = False,
    **answers: Any,
):
    """Render the template into ``dst`` with ``answers`` (defaults for the rest); return copier's Worker.

    ``tasks=False`` is ``copier copy --skip-tasks`` without ``--trust``; ``tasks=True`` is
    ``copier copy --trust`` (the post-copy hook runs). ``pretend=True`` asks and validates
    the questions but writes nothing.
    """
    return copier.run_copy(
        str(src),
        str(dst),
        data=answers,
        defaults=True,
        vcs_ref=vcs_ref,
        unsafe=tasks,
        skip_tasks=not tasks,
        pretend=pretend,
        quiet=True,
    )


def rendered_files(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` (relative POSIX path -> bytes), skipping .git and caches."""
    out = {}
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root)
        if NOT_RENDERED.intersection(rel.parts) or not path.is_file():
            continue
        out[rel.as_posix()] = path.read_bytes()
    return out


def leftover_jinja(files: dict[str, bytes]) -> list[str]:
    """Descriptions of Jinja left in file names or contents (empty when the render is clean)."""
    problems = []
    for rel, content in files.items():
        if ".jinja" in rel or "{{" in rel or "{%" in rel:
            problems.append(f"{rel}: Jinja in the file name")
        text = content.decode("utf-8", errors="replace")
        for lineno, line in enumerate(text.splitlines(), 1):
            if JINJA_EXPR.search(line) or JINJA_TAG.search(line):
                problems.append(f"{rel}:{lineno}: {line.strip()[:120]}")
    return problems


def run(
    cmd: list[str], cwd: Path, *, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess:
    """Run ``cmd`` in its own process group; on timeout (or any interruption) kill that group.

    Returns the CompletedProcess with stdout and stderr merged into ``stdout``.
    """
    proc = subprocess.Popen(
        cmd,
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        out, _ = proc.communicate()
        pytest.fail(f"{' '.join(cmd)} (in {cwd}) ran past {timeout} s and was killed:\n{tail(out)}")
    except BaseException:
        _kill_group(proc)
        proc.communicate()
        raise
    return subprocess.CompletedProcess(cmd, proc.returncode, out, "")


def _kill_group(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)


def tail(text: str, lines: int = 80) -> str:
    return "\n".join((text or "").splitlines()[-lines:])


def project_env(project: Path) -> dict[str, str]:
    """Environment for running a rendered project's code: PYTHONPATH=src, no inherited pytest options."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "PYTHON"))}
    env["PYTHONPATH"] = str(project / "src")
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def git(cwd: Path, *args: str) -> str:
    """Run git in ``cwd``; fail the test with git's output when it fails; return stdout stripped."""
    result = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        pytest.fail(f"git {' '.join(args)} failed in {cwd}:\n{result.stdout}{result.stderr}")
    return result.stdout.strip()


def copy_template_repo(dst: Path, tag: str = "v0.1.0") -> Path:
    """Copy this working tree (tracked and untracked-not-ignored files) into a fresh git repo at ``dst``.

    The copy has one commit tagged ``tag``: a clean template repository with a version, as
    ``copier copy``/``copier update`` see a released template.
    """
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        check=True,
    ).stdout.decode()
    dst.mkdir(parents=True)
    copied = 0
    for rel in filter(None, listed.split("\0")):
        src = REPO / rel
        if not src.is_file():  # deleted in the working tree, or a submodule
            continue
        target = dst / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, target)
        copied += 1
    assert copied and (dst / "copier.yml").is_file(), f"copied {copied} files; no copier.yml"
    git(dst, "init", "-q")
    git(dst, "add", "-A")
    git(dst, "commit", "-q", "-m", "template")
    git(dst, "tag", tag)
    return dst


@pytest.fixture(scope="session", autouse=True)
def hermetic_git(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """A fixed git identity and no global/system git config, for our git calls and copier's.

    Copier runs git through plumbum, whose environment is a copy of os.environ taken at import
    time, so the variables are set in both.
    """
    gitconfig = tmp_path_factory.mktemp("git") / "gitconfig"
    gitconfig.write_text("[init]\n\tdefaultBranch = main\n[commit]\n\tgpgsign = false\n", encoding="utf-8")
    env = {**GIT_IDENTITY, "GIT_CONFIG_GLOBAL": str(gitconfig), "GIT_CONFIG_NOSYSTEM": "1"}
    with pytest.MonkeyPatch.context() as mp, local.env(**env):
        for key, value in env.items():
            mp.setenv(key, value)
        yield


# Tests that share an expensive module-scoped fixture are one unit of work, run by one xdist
# worker (its fixture built once): each render combination's checks and suite, each release's
# update, the real-Slurm cluster and its project. Other tests are units of their own. (xdist's
# `xdist_group` mark does not group under pytest 9: its suffix on `item._nodeid` is not read.)
SHARED = {"test_render.py": "param", "test_update.py": "param", "test_slurm.py": "module"}
# The longest units, longest first (their times in the CI log's durations); the workers take units
# in collection order, so these start first and the workers' last units are the short ones.
LONGEST_FIRST = (
    "test_users_changes.py",
    "test_render.py[folder-image-1x0gpu]",
    "test_render.py[shards-image-1x0gpu]",
    "test_slurm.py",
    "test_render.py[stream-sqlite-image-1x0gpu]",
    "test_render.py[stream-http-image-1x0gpu]",
    "test_install.py",
    "test_update.py",
)


def work_unit(nodeid: str) -> str:
    """A test's unit of work: ``tests/test_render.py[<combination>]``, ``tests/test_slurm.py``, or the test."""
    path, _, test = nodeid.partition("::")
    how = SHARED.get(path.rsplit("/", 1)[-1])
    if how == "module" or (how == "param" and "[" not in test):
        return path
    if how == "param":
        return f"{path}[{test.split('[', 1)[1]}"
    return nodeid


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    def order(item: pytest.Item) -> int:
        unit = work_unit(item.nodeid).rsplit("/", 1)[-1]
        return next((i for i, name in enumerate(LONGEST_FIRST) if unit.startswith(name)), len(LONGEST_FIRST))

    items.sort(key=order)  # stable: the rest keep pytest's order (each render's tests together)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """``--dist loadscope`` with the units of :func:`work_unit`, handed out in collection order."""
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class SharedFixtureScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return work_unit(nodeid)

    config.option.loadscopereorder = False  # keep LONGEST_FIRST's order, not "most tests first"
    return SharedFixtureScheduling(config, log)
