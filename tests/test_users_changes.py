"""A user's correct first changes keep the project's own tests green.

Render the default project (folder/image), make the changes a user makes in their first week,
by script, in the files the README says are theirs: a torchvision resnet18 as the model, a new
key it reads (`model.zero_init`, one field in model.py), ColorJitter in the train transform,
label smoothing 0.1 in the loss, a print of the loss at every step. Then run the project's fast
suite: it checks the pipeline's guarantees and the contract those files keep, so it must stay
green (and fast: it trains the tests' own small model, not the user's resnet18, but for the
contract tests and the commands it runs as processes).
"""

from __future__ import annotations

import re
import sys
import time

import pytest
from conftest import project_env, render, run, tail

# (file, the rendered text, what the user writes instead)
CHANGES = [
    (
        "model.py",
        "    return SmallCNN(num_classes, width=cfg.model.width)\n",
        "    import torchvision\n\n"
        "    return torchvision.models.resnet18(num_classes=num_classes, zero_init_residual=cfg.model.zero_init)\n",
    ),
    (  # a new key the model reads: one field, in the same file
        "model.py",
        "    width: int = 32\n",
        "    width: int = 32\n    # Start each residual block as the identity (its last BatchNorm's weight at 0).\n"
        "    zero_init: bool = True\n",
    ),
    (
        "task.py",
        "    return v2.Compose([crop, v2.RandomHorizontalFlip()])\n",
        "    return v2.Compose([crop, v2.RandomHorizontalFlip(), v2.ColorJitter(0.4, 0.4, 0.4)])\n",
    ),
    (
        "task.py",
        "        return F.cross_entropy(logits.float(), target)\n",
        "        loss = F.cross_entropy(logits.float(), target, label_smoothing=0.1)\n"
        '        print(f"loss {loss.item():.4f}")\n'
        "        return loss\n",
    ),
]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_users_first_changes_keep_the_fast_suite_green(tmp_path):
    project = tmp_path / "project"
    render(project, project_name="Users Project")
    for name, was, now in CHANGES:
        path = project / "src" / "users_project" / name
        text = path.read_text(encoding="utf-8")
        assert was in text, f"the rendered {name} has no {was!r}: update this test's CHANGES"
        path.write_text(text.replace(was, now, 1), encoding="utf-8")
    start = time.monotonic()
    result = run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"], project, env=project_env(project), timeout=800
    )
    seconds = time.monotonic() - start
    assert result.returncode == 0, f"a user's correct changes turned the project's tests red:\n{tail(result.stdout)}"
    assert re.search(r"\b\d+ passed\b", result.stdout), tail(result.stdout)
    # the new key is a key: set on the command line, checked, and read by the model
    probe = "from users_project.config import load_config; print(load_config(None, ['model.zero_init=false']).model)"
    said = run([sys.executable, "-c", probe], project, env=project_env(project))
    assert said.returncode == 0 and "zero_init=False" in said.stdout, tail(said.stdout)
    print(f"the fast suite with the user's changes: {seconds:.0f} s")
