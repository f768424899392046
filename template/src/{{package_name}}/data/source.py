"""The source interface: what every data source gives the loader factory, ``train`` and ``bench``.

A source reads one split of the data, for one rank, and turns each sample's bytes into a
sample dict with the task (``task.py``)::

    {"input": tensor, "target": int, "key": str}   # a good sample
    {"key": str, "bad": "Reason: ..."}             # one that could not be read or decoded

It is a torch ``Dataset`` (map-style: ``__len__`` and ``__getitem__``; the loader's sampler
splits it by rank) or an ``IterableDataset`` that splits itself by rank, then by worker.
This project's source is the one ``data/__init__.py`` names. To read another kind of data,
write a module with a config dataclass (its keys join the ``data`` section) and a subclass of
:class:`Source`, and name both there.
"""

from __future__ import annotations

import abc
from collections.abc import Iterator

from .. import dist
from ..errors import UserError
from ..task import Task


class Source(abc.ABC):
    """The interface of a data source; build one with :meth:`open`.

    Args:
        cfg (DataConfig): the ``data`` section of the config.
        split (str): ``"train"`` or ``"val"``.
        task (Task): decodes and transforms one sample (this split's transforms).
        seed (int): seeds whatever order the source itself draws (``train.seed``).
        rank, world_size (int): which share of the data this process reads.

    A subclass sets ``classes`` (class names in label order) in its constructor.
    """

    classes: list[str]

    def __init__(self, cfg, split: str, task: Task, *, seed: int = 0, rank: int = 0, world_size: int = 1) -> None:
        if split not in ("train", "val"):
            raise ValueError(f"split {split!r} is unknown (expected 'train' or 'val')")
        if not 0 <= rank < world_size:
            raise ValueError(f"Invalid rank {rank}, rank should be in the interval [0, {world_size - 1}]")
        self.cfg, self.split, self.task, self.seed = cfg, split, task, seed
        self.rank, self.world_size = rank, world_size

    @classmethod
    def open(cls, cfg, split: str, *, rank: int | None = None, world_size: int | None = None) -> Source:
        """The source of ``split`` for this process (or the given rank), its task prepared.

        Args:
            cfg (Config): the run's config.
            split (str): ``"train"`` or ``"val"``.
            rank, world_size (int, optional): default to the running process group's; pass
                them to build another rank's share (tests, ``bench``'s checks).
        """
        if rank is None or world_size is None:
            rank, world_size = dist.get_rank(), dist.get_world_size()
        source = cls(cfg.data, split, Task(cfg.data, split), seed=cfg.train.seed, rank=rank, world_size=world_size)
        source.task.prepare(source.peek(16), where=cfg.data.root)
        return source

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    @abc.abstractmethod
    def peek(self, n: int) -> list[bytes]:
        """The raw bytes of the first ``n`` train samples (to check the data before training)."""

    @abc.abstractmethod
    def fingerprint(self) -> dict:
        """What identifies this data: tuned loader settings are kept per fingerprint."""

    def identity(self) -> dict:
        """This split's data in enough detail to tell that a cache made from it is stale.

        Costlier than :meth:`fingerprint` (it may look at every file): ``pack --to cache``
        records it, and training from a cache compares it (see data/cache.py). Optional, as
        :meth:`records` is: only ``pack --to cache`` needs them.
        """
        raise UserError(f"{type(self).__name__} defines no identity(), which `pack --to cache` needs")

    def records(self, start=None) -> Iterator[tuple]:
        """Every sample of this process's share, undecoded, in a fixed order, from cursor ``start``.

        Yields ``(key, label, bytes or the Exception reading them, cursor)``; passing a row's
        cursor (a JSON value) as ``start`` continues after that row (``pack`` resumes so).
        """
        raise UserError(f"{type(self).__name__} defines no records(), which `pack --to cache` needs")

    def planned_batches(self, batch_size: int, num_workers: int, drop_last: bool) -> int | None:
        """Batches every rank yields this epoch: the fewest of any rank; ``None`` if unknown.

        A map-style source needs none (the loader's sampler evens out the ranks).
        """
        return None

    def max_workers(self) -> int | None:
        """The most loader workers this source can give data to (``None``: no limit)."""
        return None

    def check_workers(self, num_workers: int) -> None:  # noqa: B027 (an optional hook)
        """Refuse a loader set-up under which this source cannot work (default: any works)."""

    def set_epoch(self, epoch: int) -> None:  # noqa: B027 (an optional hook)
        """A new epoch starts (an iterable source reorders itself; a map-style one's sampler does)."""
