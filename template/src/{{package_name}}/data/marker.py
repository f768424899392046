"""``sample-data``'s mark on what it writes, so that it never overwrites data it did not write.

It writes only where nothing is (a missing path, an empty folder) or where it wrote before
(the mark is there: ``<folder>/.sample-data``, or ``<file>.sample-data`` beside a file).
"""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import UserError

MARK = ".sample-data"


def _mark_of(path: Path, folder: bool) -> Path:
    return path / MARK if folder else path.with_name(path.name + MARK)


def claim(path: str | os.PathLike, folder: bool) -> None:
    """Refuse to write ``path`` (a folder, or a file) unless nothing is there or sample-data wrote it."""
    path = Path(path)
    if not path.exists() or _mark_of(path, folder).exists():
        return
    if folder and path.is_dir() and not any(path.iterdir()):
        return
    raise UserError(
        f"{path} holds data that sample-data did not write, and sample-data never overwrites it: "
        f"pass --out with a new path (or remove {path} yourself)"
    )


def mark(path: str | os.PathLike, folder: bool) -> None:
    """Mark ``path`` as sample-data's own, so that a later sample-data may write it again."""
    path = Path(path)
    _mark_of(path, folder).write_text(
        "Written by `sample-data`; it may write here again. Delete this file to keep it from doing so.\n",
        encoding="utf-8",
    )
