"""A user's correct first changes keep the project's own tests green, and `copier update` keeps them.

Render the default project (folder/image) from a scratch copy of this template, make the changes
a user makes in their first week, by script, in every file the README says is theirs: a
torchvision resnet18 as the model, a new key it reads (`model.zero_init`, one field in model.py),
ColorJitter in the train transform, label smoothing 0.1 in the loss, a print of the loss at every
step, CutMix or MixUp on each training batch (a collate of theirs, as torchvision's references
add them, with the task's num_classes) and a metric for their mixed targets, their run settings in
configs/default.yaml, and a source of their own (a CSV of file paths and classes: one module of
theirs and one line in sources.py). Commit. Then the template's next release
changes every file of the template (the user's too: their new version must not arrive) and the
project updates to it: no conflict marker or rejected hunk anywhere, each user file exactly as
the user left it, each template change applied. Then run the project's fast suite: it checks
the pipeline's guarantees and the contract those files keep, so it must stay green (and fast: it
trains the tests' own small model, not the user's resnet18, but for the contract tests and the
commands it runs as processes); the user's source gets the sources' contract tests (test_sources.py)
by implementing the sample-data protocol, and trains.

Their changes, and the folder image project's fast suite with its `common` tests, are checked here,
once, with the forkserver; its slow suite runs in test_render.py. How macOS and Windows start workers
(spawn) is checked by the tests parametrized over `loader.start_method` (a mistake in a worker, a
lambda in a transform, the stop signals, a worker killed, bench's memory, the cache's decoding), and
here by the user's source trained under spawn (`<PACKAGE>_START_METHOD=spawn`): the whole suite under
spawn took 3x its forkserver time (16 minutes alone on 2 cores), a starting worker importing torch,
torchvision and the project again. It is its own unit of work and starts first (conftest.LONGEST_FIRST).
"""

from __future__ import annotations

import os
import re
import sys
import time
from pathlib import Path

import copier
import pytest
from conftest import copy_template_repo, git, project_env, render, rendered_files, run, tail

# (file, the rendered text, what the user writes instead)
CHANGES = [
    (
        "src/users_project/model.py",
        "    return SmallCNN(num_classes, width=cfg.model.width)\n",
        "    import torchvision\n\n"
        "    return torchvision.models.resnet18(num_classes=num_classes, zero_init_residual=cfg.model.zero_init)\n",
    ),
    (  # a new key the model reads: one field, in the same file
        "src/users_project/model.py",
        "    width: int = 32\n",
        "    width: int = 32\n    # Start each residual block as the identity (its last BatchNorm's weight at 0).\n"
        "    zero_init: bool = True\n",
    ),
    (
        "src/users_project/task.py",
        "        return RandomResizedCropFlip(size, self.crop_scale, self.crop_ratio)\n",
        "        crop = RandomResizedCropFlip(size, self.crop_scale, self.crop_ratio)\n"
        "        return v2.Compose([crop, v2.ColorJitter(0.4, 0.4, 0.4)])\n",
    ),
    (  # their run settings
        "configs/default.yaml",
        "  epochs: 3\n",
        "  epochs: 2\n",
    ),
    (  # a source of their own: the module below, and this line
        "src/users_project/sources.py",
        "SOURCES: dict[str, str] = {}\n",
        'SOURCES: dict[str, str] = {"csv": ".csv_source:CSVSource"}\n',
    ),
    (  # a batch augmentation that mixes labels, as torchvision's references add one: its targets are probabilities
        "src/users_project/task.py",
        "        return (logits.argmax(1) == target).sum()\n",
        "        return (logits.argmax(1) == (target.argmax(1) if target.dim() > 1 else target)).sum()\n\n"
        "    def collate(self, samples):\n"
        "        batch = super().collate(samples)\n"
        '        if self.split == "train":\n'
        "            n = self.num_classes\n"
        "            mix = v2.RandomChoice([v2.CutMix(num_classes=n), v2.MixUp(num_classes=n)])\n"
        '            batch["input"], batch["target"] = mix(batch["input"].float(), batch["target"])\n'
        "        return batch\n",
    ),
    (
        "src/users_project/task.py",
        "        return F.cross_entropy(logits.float(), target)\n",
        "        loss = F.cross_entropy(logits.float(), target, label_smoothing=0.1)\n"
        '        print(f"loss {loss.item():.4f}")\n'
        "        return loss\n",
    ),
]


# A module of the user's: a source reading root/samples.csv (split, class, path), written as a user would.
CSV_SOURCE = '''"""Samples listed in a CSV: ``root/samples.csv``, its columns split, class, path (under root)."""

from __future__ import annotations

import csv
import os

import numpy as np
from torch.utils.data import Dataset

from .data.source import Source


class CSVSource(Source, Dataset):
    def __init__(self, cfg, split, task, **kwargs) -> None:
        super().__init__(cfg, split, task, **kwargs)
        self.root = cfg.root
        with open(os.path.join(cfg.root, "samples.csv"), newline="", encoding="utf-8") as f:
            rows = list(csv.DictReader(f))
        train = [r for r in rows if r["split"] == "train"]
        self.classes = sorted({r["class"] for r in train})
        mine = [r for r in rows if r["split"] == split]
        self.paths = np.array([r["path"] for r in mine])  # arrays, not lists: workers copy nothing on read
        self.labels = np.array([self.classes.index(r["class"]) for r in mine])
        self.first = [r["path"] for r in train[:16]]

    def __len__(self) -> int:
        return len(self.paths)

    def read(self, path: str) -> bytes:
        with open(os.path.join(self.root, path), "rb") as f:
            return f.read()

    def __getitem__(self, i: int) -> dict:
        key = str(self.paths[i])
        try:
            sample = self.transformed(key, self.task, self.read(key))
        except Exception as e:
            return {"key": key, "bad": f"{type(e).__name__}: {e}"}
        return {"input": sample, "target": int(self.labels[i]), "key": key}

    def peek(self, n: int) -> list[bytes]:
        return [self.read(p) for p in self.first[:n]]

    def fingerprint(self) -> dict:
        return {"rows": len(self.paths)}

    @classmethod
    def write_samples(cls, cfg, dest, samples) -> None:
        os.makedirs(os.path.join(dest, "files"), exist_ok=True)
        with open(os.path.join(dest, "samples.csv"), "w", newline="", encoding="utf-8") as f:
            out = csv.writer(f)
            out.writerow(["split", "class", "path"])
            for s in samples:
                path = f"files/{s.split}-{s.label_name}-{s.name}{s.ext}"
                with open(os.path.join(dest, path), "wb") as g:
                    g.write(s.data)
                out.writerow([s.split, s.label_name, path])
'''
NEW_FILES = {"src/users_project/csv_source.py": CSV_SOURCE}

# The user's files (the README's "Which files are yours"), and what the next release appends to every file.
USER_FILES = {
    "src/users_project/model.py",
    "src/users_project/task.py",
    "src/users_project/sources.py",
    "configs/default.yaml",
    *NEW_FILES,
}
NEXT_RELEASE = "the next release changed this file"
# Seconds the fast suite may take.
SUITE_TIMEOUT_S = int(os.environ.get("TORCHFEED_SUITE_TIMEOUT_S", "1200"))
MARKERS = ("<<<<<<<", "=======", ">>>>>>>")


def change_every_file(template: Path) -> int:
    """The next release: a line at the end of every file the template renders (as a comment of its kind)."""
    changed = 0
    for path in sorted((template / "template").rglob("*")):
        if not path.is_file() or path.name.startswith("{{_copier_conf"):
            continue
        comment = f"<!-- {NEXT_RELEASE} -->" if ".md" in path.name else f"# {NEXT_RELEASE}"
        path.write_text(path.read_text(encoding="utf-8") + comment + "\n", encoding="utf-8")
        changed += 1
    git(template, "commit", "-q", "-a", "-m", "the next release")
    return changed


@pytest.mark.slow
@pytest.mark.timeout(SUITE_TIMEOUT_S + 600)
def test_a_users_first_changes_keep_the_fast_suite_green_and_survive_an_update(tmp_path):
    template, project = copy_template_repo(tmp_path / "template", tag="v1.0.0"), tmp_path / "project"
    render(project, src=template, tasks=True, project_name="Users Project")
    for name, was, now in CHANGES:
        path = project / name
        text = path.read_text(encoding="utf-8")
        assert was in text, f"the rendered {name} has no {was!r}: update this test's CHANGES"
        path.write_text(text.replace(was, now, 1), encoding="utf-8")
    for name, text in NEW_FILES.items():
        (project / name).write_text(text, encoding="utf-8")
    git(project, "add", "-A")
    git(project, "commit", "-q", "-m", "my changes")
    users = {rel: content for rel, content in rendered_files(project).items() if rel in USER_FILES}
    assert set(users) == USER_FILES

    assert change_every_file(template) > len(USER_FILES)
    copier.run_update(str(project), defaults=True, overwrite=True, unsafe=True, vcs_ref="HEAD", quiet=True)
    files = rendered_files(project)
    conflicted = [
        rel
        for rel, content in files.items()
        if rel.endswith((".rej", ".orig")) or any(line.startswith(MARKERS) for line in content.decode().splitlines())
    ]
    assert not conflicted, f"the update left conflicts or rejected hunks: {conflicted}"
    assert {rel: files.get(rel) for rel in USER_FILES} == users, "the update rewrote a file of the user's"
    theirs = set(files) - USER_FILES - {".copier-answers.yml"}
    missed = sorted(rel for rel in theirs if NEXT_RELEASE.encode() not in files[rel])
    assert not missed, f"the template's change did not arrive in {missed}"
    start = time.monotonic()
    result = run(
        [sys.executable, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider", "--durations=15"],
        project,
        env=project_env(project),
        timeout=SUITE_TIMEOUT_S,
    )
    seconds = time.monotonic() - start
    shown = "\n".join(line for line in result.stdout.splitlines() if not line.startswith("PASSED "))  # -rA's list
    assert result.returncode == 0, f"a user's correct changes turned its tests red:\n{tail(shown)}"
    assert re.search(r"\b\d+ passed\b", result.stdout), tail(result.stdout)
    # their source got the sources' contract tests, but the cache's (it defines no identity()/records())
    passed = re.findall(r"^PASSED tests/test_sources\.py::\w+\[csv\b", result.stdout, flags=re.MULTILINE)
    assert len(passed) >= 10, tail(result.stdout)
    assert "CSVSource defines no identity()/records(): it cannot be cached" in result.stdout
    # and trains, its workers started by spawn as on macOS and Windows: sample data written by its
    # write_samples, selected by data.source
    env = {**project_env(project), "USERS_PROJECT_START_METHOD": "spawn"}
    csv_run = ["data.source=csv", "data.root=data/csv", "data.image_size=32"]
    wrote = run(
        [sys.executable, "-m", "users_project", "sample-data", "--per-class", "8", *csv_run],
        project,
        env=env,
    )
    assert wrote.returncode == 0 and "data.source=csv" in wrote.stdout, tail(wrote.stdout)
    trained = run(
        [
            sys.executable,
            "-m",
            "users_project",
            "train",
            *csv_run,
            "train.epochs=1",
            "loader.tuned=",
            "train.run_dir=runs/csv",
        ],
        project,
        env=env,
        timeout=300,
    )
    assert trained.returncode == 0 and (project / "runs/csv/metrics.jsonl").is_file(), tail(trained.stdout)
    # the new key is a key: set on the command line, checked, and read by the model
    probe = "from users_project.config import load_config; print(load_config(None, ['model.zero_init=false']).model)"
    said = run([sys.executable, "-c", probe], project, env=env)
    assert said.returncode == 0 and "zero_init=False" in said.stdout, tail(said.stdout)
    print(f"the fast suite with the user's changes: {seconds:.0f} s")
