# torchfeed's file: `copier update` replaces it. Your model is model.py; your augmentations, loss and
# metric are task.py; your settings configs/default.yaml (README.md: "Which files are yours").
"""``sample-data``'s mark on what it writes, so that it never overwrites data it did not write.

It writes only where nothing is (a missing path, an empty folder) or where it wrote before
(the mark is there: ``<folder>/.sample-data``, or ``<file>.sample-data`` beside a file). The
mark lists the files it wrote, and a later sample-data replaces those and only those: sample
data of another format or size leaves none of the old behind, and a file the user added stays.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

from ..errors import UserError

MARK = ".sample-data"
FILES = "files: "  # the mark's line listing what was written, relative to the folder


def _mark_of(path: Path, folder: bool) -> Path:
    return path / MARK if folder else path.with_name(path.name + MARK)


def claim(path: str | os.PathLike) -> None:
    """Refuse to write ``path`` (a folder, or a file) unless nothing is there or sample-data wrote it.

    In a folder it wrote before, the files it wrote then are removed (and folders they leave empty).
    """
    path = Path(path)
    folder = path.is_dir()
    mark_file = _mark_of(path, folder)
    if not path.exists() or (folder and path.is_dir() and not any(path.iterdir())):
        return
    if not mark_file.exists():
        raise UserError(
            f"{path} holds data that sample-data did not write, and sample-data never overwrites it: "
            f"pass --out with a new path (or remove {path} yourself)"
        )
    if folder:
        _remove_listed(path, mark_file)


def _remove_listed(folder: Path, mark_file: Path) -> None:
    listed = []
    for line in mark_file.read_text(encoding="utf-8", errors="replace").splitlines():
        if line.startswith(FILES):
            with contextlib.suppress(ValueError):
                listed = json.loads(line[len(FILES) :])
    root = folder.resolve()
    parents = set()
    for name in listed if isinstance(listed, list) else []:
        target = (folder / str(name)).resolve()
        if root not in target.parents or not target.is_file():  # only files inside the folder
            continue
        target.unlink()
        parents.update(p for p in target.parents if root in p.parents)
    for parent in sorted(parents, key=lambda p: len(p.parts), reverse=True):  # the deepest first
        with contextlib.suppress(OSError):
            parent.rmdir()  # only if empty


def mark(path: str | os.PathLike, files: list[str] = ()) -> None:
    """Mark ``path`` (a folder or a file) as sample-data's own, listing the ``files`` (in a folder) it wrote."""
    path = Path(path)
    folder = path.is_dir()
    if folder:
        text = "Written by `sample-data`; it may write here again, replacing the files listed below (and only those).\n"
    else:
        text = f"Written by `sample-data`; it may write {path.name} again, replacing it.\n"
    text += "Delete this file to keep it from doing so.\n"
    if folder:
        text += FILES + json.dumps(sorted(files)) + "\n"
    _mark_of(path, folder).write_text(text, encoding="utf-8")
