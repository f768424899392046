"""Folder source: ``root/<split>/<class_name>/<file>``, a map-style Dataset."""

from __future__ import annotations

import logging
import os

import numpy as np
from torch.utils.data import Dataset

from .strings import StringArray

log = logging.getLogger(__name__)

LAYOUT = "root/{train,val}/<class_name>/<file>"


def scan_classes(split_dir: str) -> list[str]:
    """Sorted names of the class folders under ``split_dir``."""
    if not os.path.isdir(split_dir):
        raise FileNotFoundError(f"data folder {split_dir} does not exist (expected {LAYOUT})")
    with os.scandir(split_dir) as entries:
        classes = sorted(e.name for e in entries if e.is_dir() and not e.name.startswith("."))
    if not classes:
        raise FileNotFoundError(f"data folder {split_dir} has no class folders (expected {LAYOUT})")
    return classes


class FolderDataset(Dataset):
    """Samples from ``root/<split>/<class>/<file>``, scanned once, read per item.

    Args:
        root (str): the folder holding ``train/`` and ``val/``.
        split (str): ``"train"`` or ``"val"``.
        fmt: the sample format (decodes bytes, knows the file extensions, batches).
        transform (callable, optional): applied to the decoded sample (train and val differ).
        classes (list of str, optional): class names in label order; default: the split's own
            folders. Pass the train split's classes to the val split so labels agree.

    ``__getitem__`` returns ``{"input", "target", "key"}``; a file that cannot be read or
    decoded returns ``{"key", "bad"}`` instead, for the loader to count (see ``budget.py``).
    The index lives in NumPy arrays, and no file handle outlives one ``__getitem__``.
    """

    def __init__(self, root, split: str, fmt, transform=None, classes=None) -> None:
        self.root = os.fspath(root)
        self.split = split
        self.fmt = fmt
        self.transform = transform
        split_dir = os.path.join(self.root, split)
        found = scan_classes(split_dir)
        self.classes = list(classes) if classes is not None else found
        unknown = sorted(set(found) - set(self.classes))
        if unknown:
            raise ValueError(f"{split_dir} has class folders {unknown} that the train split lacks")
        keys, labels, ignored = [], [], 0
        for label, name in enumerate(self.classes):
            class_dir = os.path.join(split_dir, name)
            if not os.path.isdir(class_dir):
                continue
            with os.scandir(class_dir) as entries:
                for e in sorted(entries, key=lambda e: e.name):
                    if e.is_file() and e.name.lower().endswith(fmt.extensions):
                        keys.append(f"{split}/{name}/{e.name}")
                        labels.append(label)
                    else:
                        ignored += 1
        if not keys:
            raise FileNotFoundError(
                f"data folder {split_dir} has no {'/'.join(fmt.extensions)} files in its class "
                f"folders (expected {LAYOUT})"
            )
        if ignored:
            log.info("%s: ignored %d entries that are not %s files", split_dir, ignored, fmt.extensions)
        self.keys = StringArray(keys)
        self.targets = np.asarray(labels, dtype=np.int64)

    def __len__(self) -> int:
        return len(self.targets)

    def read(self, index: int) -> bytes:
        """The raw bytes of sample ``index`` (the file is closed before this returns)."""
        with open(os.path.join(self.root, self.keys[index]), "rb") as f:
            return f.read()

    def __getitem__(self, index: int) -> dict:
        key = self.keys[index]
        try:
            sample = self.fmt.decode(self.read(index))
        except Exception as e:  # unreadable or corrupt: counted by the loader's budget
            return {"key": key, "bad": f"{type(e).__name__}: {e}"}
        if self.transform is not None:
            sample = self.transform(sample)
        return {"input": sample, "target": int(self.targets[index]), "key": key}
