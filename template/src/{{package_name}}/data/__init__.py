"""The data pipeline: ``build_dataset(cfg, split)`` and ``build_loader(dataset, cfg, split)``.

from <package>.config import load_config
from <package>.data import build_dataset, build_loader
cfg = load_config()
loader = build_loader(build_dataset(cfg, "train"), cfg, "train")
"""

from __future__ import annotations

from .. import project
from .budget import BadSampleBudget, BadSampleBudgetExceeded
from .formats import SkipBadCollate, build_format
from .loader import build_loader, set_epoch
from .transforms import build_transform

__all__ = [
    "BadSampleBudget",
    "BadSampleBudgetExceeded",
    "build_dataset",
    "build_loader",
    "set_epoch",
]

SPLITS = ("train", "val")


def build_dataset(cfg, split: str):
    """The Dataset for ``split`` ("train" | "val"), with that split's transform.

    Args:
        cfg (Config): the run's config (``data.*`` is used).
        split (str): ``"train"`` (augmented, shuffled) or ``"val"`` (deterministic, in order).
    """
    if split not in SPLITS:
        raise ValueError(f"split {split!r} is unknown (expected one of {SPLITS})")
    fmt = build_format(project.DATA_FORMAT, cfg.data.image_size)
    transform = build_transform(project.DATA_FORMAT, split, cfg.data.image_size, cfg.data.max_len)
    if project.DATA_SOURCE == "stream":
        from .stream import open_stream as open_source
    elif project.DATA_SOURCE == "shards":
        from .shards import open_shards as open_source
    else:
        from .folder import open_folder as open_source
    dataset = open_source(cfg, split, fmt, transform)
    dataset.collate_fn = SkipBadCollate(fmt.collate)
    return dataset
