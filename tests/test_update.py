"""`copier update`: a project rendered from template v0.1.0, edited by its user, updated to v0.2.0.

The template is a copy of this working tree in a fresh git repository (so uncommitted work is
tested too), tagged v0.1.0; the test then commits a template change and tags v0.2.0.
"""

from __future__ import annotations

from pathlib import Path

import copier
import pytest
import yaml
from conftest import copy_template_repo, git, render, rendered_files

PACKAGE_DIR = "template/src/{{package_name}}"
USER_CONFIG_LINE = "# my note: the cluster's data lives on /scratch (kept across updates)"
TEMPLATE_CONFIG_LINE = "# (template v0.2.0: a line the template added to the header)"
TEMPLATE_LOADER_LINE = "# torchfeed v0.2.0: the loader module changed in the template"
TEMPLATE_NEW_FILE = "docs/UPDATING.md"


def _edit_first_line(path: Path, new_line: str) -> None:
    """Insert ``new_line`` after the first line of ``path`` (a change far from the file's end)."""
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    assert lines, f"{path} is empty"
    path.write_text("".join([lines[0], new_line + "\n", *lines[1:]]), encoding="utf-8")


@pytest.fixture(scope="module")
def updated(tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("update")
    template = copy_template_repo(root / "template", tag="v0.1.0")

    # v0.1.0 -> a project under git (the post-copy hook's first commit)
    project = root / "project"
    render(project, tasks=True, src=template, vcs_ref="v0.1.0", project_name="Update Check", data_format="tensor")
    package = "update_check"
    before = {
        "commits": int(git(project, "rev-list", "--count", "HEAD")),
        "answers": yaml.safe_load((project / ".copier-answers.yml").read_text(encoding="utf-8")),
    }

    # the user edits the project: a config comment at the end, a model default, and commits
    config = project / "configs" / "default.yaml"
    config.write_text(config.read_text(encoding="utf-8") + USER_CONFIG_LINE + "\n", encoding="utf-8")
    model = project / "src" / package / "model.py"
    model_text = model.read_text(encoding="utf-8")
    assert "width: int = 32" in model_text, "model.py changed: pick another line for the user's edit"
    model.write_text(model_text.replace("width: int = 32", "width: int = 48", 1), encoding="utf-8")
    git(project, "add", "-A")
    git(project, "commit", "-q", "-m", "my changes")

    # the template changes: the same config file (header), another module, a new file; v0.2.0
    _edit_first_line(template / "template" / "configs" / "default.yaml.jinja", TEMPLATE_CONFIG_LINE)
    _edit_first_line(template / PACKAGE_DIR / "data" / "loader.py", TEMPLATE_LOADER_LINE)
    new_file = template / "template" / TEMPLATE_NEW_FILE
    new_file.parent.mkdir(parents=True, exist_ok=True)
    new_file.write_text("How to update this project: `copier update --trust`.\n", encoding="utf-8")
    git(template, "add", "-A")
    git(template, "commit", "-q", "-m", "template v0.2.0")
    git(template, "tag", "v0.2.0")

    copier.run_update(str(project), defaults=True, overwrite=True, unsafe=True, vcs_ref="v0.2.0", quiet=True)
    return {"project": project, "package": package, "before": before}


def test_render_at_v010_is_a_git_repo(updated: dict) -> None:
    assert updated["before"]["commits"] == 1
    assert updated["before"]["answers"]["_commit"] == "v0.1.0"


def test_user_edits_survive(updated: dict) -> None:
    project, package = updated["project"], updated["package"]
    assert USER_CONFIG_LINE in (project / "configs" / "default.yaml").read_text(encoding="utf-8")
    model = (project / "src" / package / "model.py").read_text(encoding="utf-8")
    assert "width: int = 48" in model and "width: int = 32" not in model


def test_template_changes_arrive(updated: dict) -> None:
    project, package = updated["project"], updated["package"]
    assert TEMPLATE_CONFIG_LINE in (project / "configs" / "default.yaml").read_text(encoding="utf-8")
    assert TEMPLATE_LOADER_LINE in (project / "src" / package / "data" / "loader.py").read_text(encoding="utf-8")
    assert (project / TEMPLATE_NEW_FILE).is_file()


def test_no_conflicts(updated: dict) -> None:
    files = rendered_files(updated["project"])
    rejects = [rel for rel in files if rel.endswith((".rej", ".orig"))]
    assert not rejects, f"rejected hunks: {rejects}"
    markers = [
        f"{rel}:{n}"
        for rel, content in files.items()
        for n, line in enumerate(content.decode("utf-8", errors="replace").splitlines(), 1)
        if line.startswith(("<<<<<<<", ">>>>>>>"))
    ]
    assert not markers, f"conflict markers: {markers}"


def test_answers_record_the_new_version(updated: dict) -> None:
    answers = yaml.safe_load((updated["project"] / ".copier-answers.yml").read_text(encoding="utf-8"))
    assert answers["_commit"] == "v0.2.0"
    kept = {k: v for k, v in updated["before"]["answers"].items() if not k.startswith("_")}
    assert {k: answers.get(k) for k in kept} == kept, "the update changed the answers"
    assert answers["project_name"] == "Update Check" and answers["data_format"] == "tensor"


def test_update_runs_no_copy_task(updated: dict) -> None:
    """The post-copy hook is for `copy` only: the update leaves its changes for the user to commit."""
    project = updated["project"]
    assert git(project, "rev-list", "--count", "HEAD") == "2"
    assert git(project, "status", "--porcelain"), "the update changed nothing in the work tree"
