# torchfeed's file: `copier update` replaces it. Your model is model.py; your augmentations, loss and
# metric are task.py; your settings configs/default.yaml; your own sources sources.py.
"""``sample-data``: a small learnable synthetic dataset (synthetic.py), written by the source.

    python -m <package> sample-data                  # -> data.root, in data.source's layout
    python -m <package> sample-data --out /tmp/s --per-class 8
    python -m <package> sample-data data.source=csv  # a source of yours (sources.py)

The source writes the samples itself (``write_samples``, the sample-data protocol in
data/source.py), so any source that implements it gets sample data. It writes only where nothing
is, or where it wrote before (data/marker.py): never over data it did not write.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterator
from pathlib import Path

from ..errors import UserError
from . import source_class
from .marker import claim, mark
from .source import Sample
from .synthetic import CLASSES, generate


def add_arguments(p: argparse.ArgumentParser, out: str | None = None) -> None:
    where = f"default: {out}" if out else "default: data.root"
    p.add_argument("--out", default=out, help=f"where to write ({where})")
    p.add_argument("--per-class", type=int, default=96, help="train samples per class (default: %(default)s)")


def synthetic_samples(cfg, per_class: int, val_per_class: int | None = None) -> Iterator[Sample]:
    """The synthetic samples: ``per_class`` train and (default a quarter as many) val samples of each class."""
    counts = {"train": per_class, "val": max(1, per_class // 4) if val_per_class is None else val_per_class}
    for split, label, name, ext, data in generate(cfg.data, counts, cfg.train.seed):
        yield Sample(split, label, CLASSES[label], name, ext, data)


def files_under(path: str | os.PathLike) -> set[str]:
    """The files under the folder ``path``, relative to it (none if it is no folder)."""
    root = Path(path)
    return {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()} if root.is_dir() else set()


def write(cfg, out: str, per_class: int) -> int:
    """Write the sample data at ``out`` with ``data.source``'s ``write_samples``; returns the samples written."""
    cls = source_class(cfg.data.source)
    if not cls.writes_samples():  # said before anything is touched
        name = cfg.data.source
        raise UserError(f"data.source={name}: {cls.__name__} defines no write_samples(), which sample-data needs")
    claim(out)
    before = files_under(out)
    written = list(synthetic_samples(cfg, per_class))
    cls.write_samples(cfg.data, out, written)
    mark(out, files=sorted(files_under(out) - before))
    return len(written)


def run(cfg, args: argparse.Namespace) -> None:
    out = args.out or cfg.data.root
    n = write(cfg, out, args.per_class)
    print(f"wrote {n} samples in {len(CLASSES)} classes to {out} (data.source={cfg.data.source})")
