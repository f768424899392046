"""The questions: every bad answer is refused with a message that says what is allowed.

Answers go through copier's API as ``data`` (what ``copier copy --data`` and the answers of a
prompt go through): copier parses the answer, checks ``choices``, then renders the question's
``validator`` and raises ``ValueError`` with its text. Accepted answers are checked with
``pretend=True`` (nothing written).
"""

from __future__ import annotations

import keyword
import re
from pathlib import Path
from typing import Any

import pytest
from conftest import copier_questions, render

IDENTIFIER = re.compile(r"[a-z_][a-z0-9_]*")


def refuse(tmp_path: Path, **answers: Any) -> str:
    """Render with ``answers``; return the text of the ValueError that must refuse them."""
    with pytest.raises(ValueError) as caught:
        render(tmp_path / "project", **answers)
    assert not (tmp_path / "project").exists(), "a refused answer still rendered files"
    return str(caught.value)


def accepted(tmp_path: Path, **answers: Any) -> dict[str, Any]:
    """Render (pretend) with ``answers``; return every answer copier settled on."""
    worker = render(tmp_path / "project", pretend=True, **answers)
    return dict(worker.answers.combined)


# (answers, texts the refusal must contain: the question and what is allowed)
BAD_ANSWERS = [
    pytest.param({"num_gpus": -1}, ["num_gpus", "0 or more"], id="num_gpus=-1"),
    pytest.param({"num_gpus": 65}, ["num_gpus", "0 to 64"], id="num_gpus=65"),
    pytest.param({"num_nodes": 0}, ["num_nodes", "1 or more"], id="num_nodes=0"),
    pytest.param({"num_nodes": -2}, ["num_nodes", "1 or more"], id="num_nodes=-2"),
    pytest.param({"batch_size": 0}, ["batch_size", "2 or more"], id="batch_size=0"),
    pytest.param({"batch_size": 1}, ["batch_size", "2 or more", "BatchNorm"], id="batch_size=1"),
    pytest.param({"project_name": ""}, ["project_name", "must not be empty"], id="project_name=''"),
    pytest.param({"project_name": "   "}, ["project_name", "must not be empty"], id="project_name=blank"),
    pytest.param({"data_format": "video"}, ["data_format", "image", "tensor", "sequence"], id="data_format=video"),
    pytest.param({"data_source": "s3"}, ["data_source", "folder"], id="data_source=s3"),
]
IDENTIFIER_HINT = ["package_name", "lowercase letters, digits and underscores", "not starting with a digit"]
for name in ["1abc", "my-pkg", "Class", "", "with space", "café"]:
    BAD_ANSWERS.append(pytest.param({"package_name": name}, IDENTIFIER_HINT, id=f"package_name={name!r}"))
BAD_ANSWERS.append(pytest.param({"package_name": "x" * 41}, ["package_name", "at most 40"], id="package_name=41chars"))
for name in ["class", "import"]:
    BAD_ANSWERS.append(pytest.param({"package_name": name}, ["package_name", "Python keyword"], id=f"keyword={name}"))
# Names the rendered project imports (or that its tests and tools import): the package would shadow them.
for name in ["torch", "torchvision", "numpy", "yaml", "logging", "json"]:
    BAD_ANSWERS.append(pytest.param({"package_name": name}, ["package_name", "shadow"], id=f"package_name={name}"))


@pytest.mark.parametrize(("answers", "texts"), BAD_ANSWERS)
def test_bad_answer_is_refused(tmp_path: Path, answers: dict[str, Any], texts: list[str]) -> None:
    message = refuse(tmp_path, **answers)
    for text in texts:
        assert text in message, f"refusal of {answers} does not mention {text!r}: {message}"


def test_choice_refusal_lists_every_offered_choice(tmp_path: Path) -> None:
    for name, question in copier_questions().items():
        choices = question.get("choices")
        if not choices:
            continue
        offered = choices.values() if isinstance(choices, dict) else choices
        message = refuse(tmp_path, **{name: "no-such-choice"})
        for value in offered:
            assert str(value) in message, f"refusal of {name}=no-such-choice does not offer {value!r}: {message}"


@pytest.mark.parametrize(
    "answers",
    [
        {"num_gpus": 0, "num_nodes": 1, "batch_size": 2},
        {"num_gpus": 64, "num_nodes": 128, "batch_size": 4096},
        {"package_name": "_private2"},
        {"package_name": "a"},
        {"project_name": "Ünïcode Project ✓"},
    ],
    ids=["minimum", "maximum", "underscore", "one-letter", "unicode-title"],
)
def test_good_answer_is_accepted(tmp_path: Path, answers: dict[str, Any]) -> None:
    settled = accepted(tmp_path, **answers)
    for key, value in answers.items():
        assert settled[key] == value


@pytest.mark.parametrize(
    ("project_name", "expected"),
    [
        ("My Cool-Project 2", "my_cool_project_2"),
        ("  Cat Classifier  ", "cat_classifier"),
        ("my-training", "my_training"),
        ("Cat  --  Classifier!", "cat_classifier"),
    ],
)
def test_default_package_name(tmp_path: Path, project_name: str, expected: str) -> None:
    assert accepted(tmp_path, project_name=project_name)["package_name"] == expected


@pytest.mark.parametrize("project_name", ["2 Fast 2 Furious", "3d-vision", "42"])
def test_default_package_name_of_a_title_starting_with_a_digit(tmp_path: Path, project_name: str) -> None:
    package = accepted(tmp_path, project_name=project_name)["package_name"]
    assert IDENTIFIER.fullmatch(package) and not keyword.iskeyword(package), f"{project_name!r} -> {package!r}"
    # The title's words survive (no digit dropped, no control character in their place).
    assert package.endswith(re.sub(r"[^a-z0-9]+", "_", project_name.lower())), f"{project_name!r} -> {package!r}"


def test_default_package_name_of_a_keyword_title_is_usable(tmp_path: Path) -> None:
    """A title that lowercases to a keyword ("Class", "Import") must not give an unimportable package."""
    for title in ["Class", "Import"]:
        try:
            package = accepted(tmp_path, project_name=title)["package_name"]
        except ValueError as refused:  # refusing the derived name is acceptable too, if it says why
            assert "package_name" in str(refused)
            continue
        assert not keyword.iskeyword(package), f"project_name {title!r} gives package_name {package!r}, a keyword"


def test_every_question_has_help() -> None:
    questions = copier_questions()
    assert {"project_name", "package_name", "data_source", "data_format", "num_gpus", "num_nodes", "batch_size"} <= set(
        questions
    )
    for name, question in questions.items():
        assert isinstance(question, dict), f"{name}: not a question mapping"
        assert str(question.get("help", "")).strip(), f"{name}: no help text"


def test_every_free_answer_question_has_a_validator() -> None:
    """Questions without choices are typed in: each needs a validator (booleans excepted)."""
    for name, question in copier_questions().items():
        if question.get("choices") or question.get("type") == "bool":
            continue
        assert str(question.get("validator", "")).strip(), f"{name}: no validator"
