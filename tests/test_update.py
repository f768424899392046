"""`copier update` from each release (CHANGELOG.md names their commits) to this working tree, over a user's edits.

As a user would: render a release with --trust (a git repository with a first commit), train it
once (a checkpoint of that release), edit a model default, config values and a comment, the README,
add a file of their own, commit, then `copier update` to the working tree. Files the user did
not touch must update without conflict; every edit must survive; conflicts in the edited
files are resolved by script as a user would (the template's new text, their values put back;
in their settings file a value the new text lacks goes back under its section). These releases
predate the user's own files (model.py, task.py, configs/default.yaml): the update merges those
one last time; from this release on it leaves them be (test_users_changes.py).
Then every file the user did not edit is byte for byte a fresh render's (whose suite
test_render.py runs), the tests of the files they edited (model, config) pass, the project
trains, and the old checkpoint resumes (a release of the same checkpoint format) or stops
`train` with one `error:` line naming its release.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import copier
import pytest
import yaml
from conftest import (
    REPO,
    copier_questions,
    copy_template_repo,
    git,
    project_env,
    render,
    rendered_files,
    run,
    tail,
)
from copier.errors import TaskError

# Each release's updated project is built once, by one worker (tests/conftest.py: work_unit).
# Each release and its commit, as CHANGELOG.md names them (a test checks that it does).
RELEASES = {"v0.1.0": "e4c65c7", "v0.2.0": "35323b2", "v0.3.0": "9a37eaf"}
# Releases whose checkpoints this one resumes (the same checkpoint format); the others' are refused naming them.
RESUMES_CHECKPOINTS_OF = {"v0.2.0", "v0.3.0"}
# Releases whose projects have files of the user's own (copier.yml's _skip_if_exists): an update leaves them be.
LEAVES_USER_FILES = {"v0.3.0"}
USER_OWN = {"src/update_check/model.py", "src/update_check/task.py", "configs/default.yaml"}
USER_FILE = "notes/experiments.md"
USER_README = "\n## Our cluster\n\nThe data lives on /scratch/cats; ask Ana for access.\n"
USER_COMMENT = "\n# ours: the cluster's data lives on /scratch (kept across updates)"
LOADER = "\nloader:\n"
SETTINGS = {"configs/default.yaml"}  # the user's run settings: a value of theirs goes back under its section
MARKERS = ("<<<<<<<", "=======", ">>>>>>>")

FOLDER_IMAGE = {"project_name": "Update Check", "data_source": "folder", "data_format": "image"}
SHARDS_SEQUENCE = {"project_name": "Update Check", "data_source": "shards", "data_format": "sequence"}
CASES = [
    pytest.param(("v0.1.0", SHARDS_SEQUENCE), id="v0.1.0-shards-sequence"),
    pytest.param(("v0.2.0", FOLDER_IMAGE), id="v0.2.0-folder-image"),
    pytest.param(("v0.3.0", FOLDER_IMAGE), id="v0.3.0-folder-image"),
]


def cli(project: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return run([sys.executable, "-m", "update_check", *args], project, env=project_env(project), timeout=timeout)


MODEL_DEFAULT = {"image": "width: int = {}", "tensor": "hidden: int = {}", "sequence": "dim: int = {}"}
MODEL_VALUES = {"image": (32, 48), "tensor": (256, 512), "sequence": (64, 96)}


def user_edits(project: Path, data_format: str) -> dict[str, list[tuple[str, str]]]:
    """Edit the project as a user would; returns, per file, ``(template's text, user's text)`` pairs."""
    was, now = (MODEL_DEFAULT[data_format].format(v) for v in MODEL_VALUES[data_format])
    if "  seed: 0 " in (project / "configs/default.yaml").read_text(encoding="utf-8"):  # every key, as before v0.3.0
        settings = [("  epochs: 3 ", "  epochs: 7 "), ("  seed: 0 ", "  seed: 42 "), (LOADER, USER_COMMENT + LOADER)]
    else:  # a few keys: the user changes one and adds one
        settings = [
            ("  epochs: 3\n", "  epochs: 7\n"),
            ("  run_dir: runs/default\n", "  run_dir: runs/default\n  seed: 42\n"),
            ("\ntrain:\n", USER_COMMENT + "\ntrain:\n"),
        ]
    edits = {
        "src/update_check/model.py": [(was, now)],
        "configs/default.yaml": settings,
        "README.md": [("", USER_README)],
    }
    for rel, pairs in edits.items():
        path = project / rel
        text = path.read_text(encoding="utf-8")
        for old, new in pairs:
            assert old in text, f"the release's {rel} has no {old!r}: pick another edit"
            text = text.replace(old, new, 1) if old else text + new
        path.write_text(text, encoding="utf-8")
    (project / USER_FILE).parent.mkdir()
    (project / USER_FILE).write_text("Run 3: lr 1e-3 was better.\n", encoding="utf-8")
    return {**edits, USER_FILE: [("", "Run 3: lr 1e-3 was better.")]}


def resolve(text: str, edits: list[tuple[str, str]], before: str | None = None) -> str:
    """Resolve inline conflicts as a user would: take the template's new text, then put the user's values back.

    In their settings file (``before``: its text before the update) a setting the new text no
    longer has goes back under its section, and a comment of theirs at the end.
    """
    pattern = re.compile(r"^<<<<<<< [^\n]*\n(.*?)^=======\n(.*?)^>>>>>>> [^\n]*\n", re.MULTILINE | re.DOTALL)
    resolved = pattern.sub(lambda m: m.group(2), text)
    for old, new in edits:
        if new.strip() in resolved:
            continue
        if old in resolved or before is None:
            resolved = resolved.replace(old, new, 1) if old else resolved + new
            continue
        key = re.match(r"^ +([a-z_]+):", new)
        if not key:  # a comment of theirs
            resolved = resolved.rstrip("\n") + "\n" + new.strip("\n") + "\n"
            continue
        section = re.findall(r"^([a-z_]+):\s*$", before[: before.index(new)], flags=re.MULTILINE)[-1]
        line = re.compile(rf"^  {key[1]}:.*$", flags=re.MULTILINE)
        if line.search(resolved):
            resolved = line.sub(new.rstrip(), resolved, count=1)
        elif re.search(rf"^{section}:\s*$", resolved, flags=re.MULTILINE):
            header = re.search(rf"^{section}:\s*\n", resolved, flags=re.MULTILINE)
            resolved = resolved[: header.end()] + new.rstrip() + "\n" + resolved[header.end() :]
        else:
            resolved = resolved.rstrip("\n") + f"\n\n{section}:\n{new.rstrip()}\n"
    return resolved


def test_the_changelog_names_each_release_s_commit() -> None:
    changelog = (REPO / "CHANGELOG.md").read_text(encoding="utf-8")
    named = dict(re.findall(r"^## (v\d+\.\d+\.\d+) \N{EM DASH} commit ([0-9a-f]{7,40})\b", changelog, re.MULTILINE))
    versions = re.findall(r"^## (v\d+\.\d+\.\d+)", changelog, re.MULTILINE)
    assert versions and set(named) == set(versions), f"a version without its commit: {set(versions) - set(named)}"
    assert named == RELEASES, "RELEASES here and CHANGELOG.md disagree"
    for version, commit in named.items():
        kind = subprocess.run(["git", "cat-file", "-t", commit], cwd=REPO, capture_output=True, text=True, check=False)
        assert kind.stdout.strip() == "commit", f"{version}'s commit {commit} is not in this clone"
        newest = re.search(r"^## (v\S+)", git(REPO, "show", f"{commit}:CHANGELOG.md"), re.MULTILINE)
        assert newest and newest[1] == version, f"{commit}'s CHANGELOG.md does not top out at {version}"


@pytest.fixture(scope="module", params=CASES)
def updated(request, tmp_path_factory) -> dict:
    release, answers = request.param
    commit = RELEASES[release]
    if subprocess.run(["git", "cat-file", "-e", f"{commit}^{{commit}}"], cwd=REPO, check=False).returncode:
        pytest.fail(f"commit {commit} ({release}) is not in this clone: fetch the full history to test the update")
    project = tmp_path_factory.mktemp("update") / "project"
    render(project, tasks=True, vcs_ref=commit, **answers)
    before = yaml.safe_load((project / ".copier-answers.yml").read_text(encoding="utf-8"))
    # the release trains once: the checkpoint a user has when they update
    assert cli(project, "sample-data", "--per-class", "8").returncode == 0
    trained = cli(project, "train", "train.epochs=1", "loader.tuned=''", "loader.batch_size=8")
    assert trained.returncode == 0, tail(trained.stdout)
    assert (project / "runs" / "default" / "checkpoint.pt").is_file()
    keep = user_edits(project, answers["data_format"])
    git(project, "add", "-A")
    git(project, "commit", "-q", "-m", "my changes")
    edited_commit = git(project, "rev-parse", "HEAD")

    copier.run_update(str(project), defaults=True, overwrite=True, unsafe=True, vcs_ref="HEAD", quiet=True)
    files = rendered_files(project)
    conflicted = sorted(
        rel
        for rel, content in files.items()
        if any(line.startswith(MARKERS) for line in content.decode("utf-8", errors="replace").splitlines())
    )
    return {
        "release": release,
        "answers": answers,
        "commit": commit,
        "project": project,
        "files": files,
        "keep": keep,
        "before": before,
        "conflicted": conflicted,
        "edited_commit": edited_commit,
        "changed": git(project, "status", "--porcelain").splitlines(),
    }


def test_the_release_renders_a_git_repository(updated: dict) -> None:
    commit = updated["before"]["_commit"]  # the tag, or copier's 0.0.0.postN+<commit> without tags
    assert commit.startswith(updated["release"]) or updated["commit"] in commit, commit


def test_files_the_user_did_not_touch_update_without_conflict(updated: dict) -> None:
    rejects = [rel for rel in updated["files"] if rel.endswith((".rej", ".orig"))]
    assert not rejects, f"rejected hunks: {rejects}"
    untouched_conflicts = [rel for rel in updated["conflicted"] if rel not in updated["keep"]]
    assert not untouched_conflicts, f"conflicts in files the user never edited: {untouched_conflicts}"


def test_every_file_the_user_did_not_edit_is_what_a_fresh_render_writes(updated: dict, tmp_path: Path) -> None:
    """The update leaves no trace of the release in the template's files: they are this version's, byte for byte."""
    fresh = tmp_path / "fresh"
    render(fresh, **updated["answers"])
    ours = {**updated["keep"], ".copier-answers.yml": []}  # the files they edited, and the answers (their _commit)
    if updated["release"] in LEAVES_USER_FILES:  # and their own files, as that release wrote them
        ours |= dict.fromkeys(USER_OWN, [])
    differ = [
        rel for rel, text in rendered_files(fresh).items() if rel not in ours and updated["files"].get(rel) != text
    ]
    assert not differ, f"after the update these differ from a fresh render: {differ}"


def test_the_users_own_files_are_left_as_they_were(updated: dict) -> None:
    """From a release with files of the user's own, the update writes nothing in them: no conflict, no change."""
    if updated["release"] not in LEAVES_USER_FILES:
        pytest.skip(f"{updated['release']} predates the user's own files: the update merges them one last time")
    for rel in sorted(USER_OWN):
        show = ["git", "show", f"{updated['edited_commit']}:{rel}"]
        was = subprocess.run(show, cwd=updated["project"], capture_output=True, check=True).stdout
        assert updated["files"][rel] == was, f"the update changed the user's {rel}"
    assert not updated["conflicted"], f"conflicts: {updated['conflicted']}"


def test_every_user_edit_survives(updated: dict) -> None:
    for rel, edits in updated["keep"].items():
        text = updated["files"][rel].decode("utf-8")
        for _, new in edits:
            assert new.strip() in text, f"{rel} lost the user's {new.strip()!r}"


def test_the_template_restructuring_arrives(updated: dict) -> None:
    files = updated["files"]
    assert "src/update_check/task.py" in files and "src/update_check/data/source.py" in files
    gone = [
        "src/update_check/data/formats.py",
        "src/update_check/data/transforms.py",
        "src/update_check/data/strings.py",
    ]
    assert not [rel for rel in gone if rel in files], "files v0.2.0 removed are still there"
    answers = yaml.safe_load(files[".copier-answers.yml"])
    questions = copier_questions()  # the user's answers (torchfeed_ownership is the template's mark)
    kept = {k: v for k, v in updated["before"].items() if k in questions}
    assert kept and {k: answers.get(k) for k in kept} == kept, "the update changed the answers"
    assert answers["torchfeed_ownership"] == 2  # the set of user files this release leaves alone
    assert git(updated["project"], "rev-parse", "HEAD") == updated["edited_commit"], "the update committed"


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_after_resolving_the_conflicts_the_project_works(updated: dict) -> None:
    project = updated["project"]
    for rel in updated["conflicted"]:
        path = project / rel
        before = git(project, "show", f"{updated['edited_commit']}:{rel}") if rel in SETTINGS else None
        resolved = resolve(path.read_text(encoding="utf-8"), updated["keep"].get(rel, []), before)
        path.write_text(resolved, encoding="utf-8")
    test_every_user_edit_survives({**updated, "files": rendered_files(project)})
    # The release's checkpoint in runs/default was trained before the user's edit of the model's width:
    # it resumes at that width (at the new one it is another model's, refused in one line).
    key = MODEL_DEFAULT[updated["answers"]["data_format"]].split(":")[0]
    width = f"model.{key}={MODEL_VALUES[updated['answers']['data_format']][0]}"
    old = cli(project, "train", "loader.tuned=''", "train.epochs=2", width)
    if updated["release"] in RESUMES_CHECKPOINTS_OF:
        assert old.returncode == 0 and "resumed from" in old.stdout and "at epoch 1" in old.stdout, tail(old.stdout)
    else:
        errors = [line for line in old.stdout.splitlines() if line.startswith("error:")]
        assert old.returncode == 2 and len(errors) == 1 and "Traceback" not in old.stdout, tail(old.stdout)
        assert updated["release"] in errors[0] and "train.resume=never" in errors[0]
    fresh = cli(project, "train", "train.resume=never", "train.epochs=1", "loader.tuned=''", "loader.batch_size=8")
    assert fresh.returncode == 0, tail(fresh.stdout)
    # Every other file is a fresh render's (the test above), whose suite test_render.py runs: here
    # the tests of the files the user edited, the model and the config.
    edited_tests = ["tests/test_model.py", "tests/test_config.py"]
    result = run(
        [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-m", "not slow", *edited_tests],
        project,
        env=project_env(project),
        timeout=800,
    )
    assert result.returncode == 0, f"the updated project's tests failed:\n{tail(result.stdout)}"


def test_an_answer_changed_on_update_never_deletes_a_file_the_user_changed(tmp_path: Path, capfd) -> None:
    """``copier update -d data_source=stream`` on a folder project whose data/folder.py the user edited
    stops before changing anything, naming the file; so does another data_format (model.py and task.py
    are the user's); once the user removed the file, the update goes on."""
    template = copy_template_repo(tmp_path / "template", tag="v1.0.0")
    project = tmp_path / "project"
    render(project, src=template, tasks=True, project_name="Answer Change")
    edited = project / "src" / "answer_change" / "data" / "folder.py"
    edited.write_text(edited.read_text(encoding="utf-8") + "# read our labels from labels.csv\n", encoding="utf-8")
    git(project, "commit", "-q", "-a", "-m", "my change")
    before = rendered_files(project)
    capfd.readouterr()
    with pytest.raises(TaskError):
        copier.run_update(
            str(project), data={"data_source": "stream"}, defaults=True, overwrite=True, unsafe=True, quiet=True
        )
    said = capfd.readouterr().err
    assert "error: with data_source=stream" in said and "src/answer_change/data/folder.py" in said, said
    assert rendered_files(project) == before and not git(project, "status", "--porcelain"), "the update changed files"
    # another sample format: model.py and task.py are the user's, written for the old one
    with pytest.raises(TaskError):
        copier.run_update(str(project), data={"data_format": "tensor"}, defaults=True, overwrite=True, unsafe=True)
    assert "changes what a sample is" in capfd.readouterr().err and rendered_files(project) == before
    # the command line's answers are strings ("0" is num_gpus=0, unchanged): nothing to stop
    copier.run_update(str(project), data={"num_gpus": "0"}, defaults=True, overwrite=True, unsafe=True, quiet=True)
    assert not git(project, "status", "--porcelain")
    git(project, "rm", "-q", str(edited.relative_to(project)))
    git(project, "commit", "-q", "-m", "my change moves to a source of my own")
    copier.run_update(
        str(project), data={"data_source": "stream"}, defaults=True, overwrite=True, unsafe=True, quiet=True
    )
    answers = yaml.safe_load((project / ".copier-answers.yml").read_text(encoding="utf-8"))
    assert answers["data_source"] == "stream" and (project / "src/answer_change/data/sqlite.py").is_file()
    assert not (project / "tests/test_folder.py").exists()  # the template's own files of the old answer go
