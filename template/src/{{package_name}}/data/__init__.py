"""The data pipeline: ``build_dataset(cfg, split)`` and ``build_loader(dataset, cfg, split)``.

from <package>.config import load_config
from <package>.data import build_dataset, build_loader
cfg = load_config()
loader = build_loader(build_dataset(cfg, "train"), cfg, "train")
"""

from __future__ import annotations

from .. import project
from .budget import BadSampleBudget, BadSampleBudgetExceeded
from .folder import FolderDataset
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
        split (str): ``"train"`` (augmented) or ``"val"`` (deterministic).
    """
    if split not in SPLITS:
        raise ValueError(f"split {split!r} is unknown (expected one of {SPLITS})")
    fmt = build_format(project.DATA_FORMAT, cfg.data.image_size)
    transform = build_transform(project.DATA_FORMAT, split, cfg.data.image_size, cfg.data.max_len)
    train = FolderDataset(cfg.data.root, "train", fmt)
    if fmt.name == "tensor":
        _fix_tensor_shape(train)  # before any worker forks, so every worker checks one shape
    if split == "train":
        train.transform = transform
        dataset = train
    else:
        dataset = FolderDataset(cfg.data.root, split, fmt, transform, classes=train.classes)
    dataset.collate_fn = SkipBadCollate(fmt.collate)
    dataset.data_size = len(train)  # part of the tuned settings' fingerprint, for both splits
    return dataset


def _fix_tensor_shape(dataset, tries: int = 16) -> None:
    errors = []
    for index in range(min(tries, len(dataset))):
        try:
            dataset.fmt.decode(dataset.read(index))
            return
        except Exception as e:
            errors.append(f"{dataset.keys[index]}: {e}")
    raise ValueError(f"no readable .npy among the first {tries} train files:\n  " + "\n  ".join(errors))
