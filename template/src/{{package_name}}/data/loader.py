"""The DataLoader factory: sampler, workers, seeding and tuned settings in one place.

loader = build_loader(dataset, cfg, "train")
for epoch in range(cfg.train.epochs):
    set_epoch(loader, epoch)  # a new shuffle each epoch, on every rank
    for batch in loader: ...
"""

from __future__ import annotations

import copy
import itertools
import logging
import math
import random
from dataclasses import dataclass

import numpy as np
import torch
from torch.utils.data import DataLoader, DistributedSampler, IterableDataset, Sampler

from .. import dist, project
from .tuned import read_tuned

log = logging.getLogger(__name__)


@dataclass
class LoaderSettings:
    """The four DataLoader arguments that `bench` tunes, resolved to concrete values."""

    num_workers: int
    prefetch_factor: int
    persistent_workers: bool
    pin_memory: bool


def resolve_settings(cfg, dataset, tuned: dict | None = None) -> LoaderSettings:
    """Turn ``auto`` values into numbers: the tuned value, else the default rule.

    Explicit values in the config always win over ``configs/tuned.yaml``.
    """
    tuned = tuned or {}
    c = cfg.loader

    def pick(name, fallback):
        value = getattr(c, name)
        return value if value != "auto" else tuned.get(name, fallback)

    num_workers = pick("num_workers", max(1, dist.usable_cpus() // dist.local_world_size()))
    if not isinstance(dataset, IterableDataset):
        num_workers = min(num_workers, len(dataset))
    return LoaderSettings(
        num_workers=num_workers,
        prefetch_factor=pick("prefetch_factor", 2),
        persistent_workers=pick("persistent_workers", True),
        pin_memory=pick("pin_memory", torch.cuda.is_available() and project.NUM_GPUS > 0),
    )


class ResumableDistributedSampler(DistributedSampler):
    """:class:`DistributedSampler` that can skip the samples a resumed run already saw.

    ``skip(n)`` drops the first ``n`` indices of the next ``__iter__`` only, so a run resumed
    mid-epoch sees the rest of that epoch's permutation (same seed and epoch) and nothing twice.
    """

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._skip = 0

    def skip(self, n: int) -> None:
        self._skip = n

    def __iter__(self):
        skip, self._skip = self._skip, 0
        return itertools.islice(super().__iter__(), skip, None)

    def __len__(self) -> int:
        return self.num_samples - self._skip


class EvalSampler(Sampler[int]):
    """Rank ``r`` of ``w`` gets indices ``r, r + w, r + 2w, ...``: every sample exactly once.

    Unlike :class:`DistributedSampler` it never pads with duplicates, so metrics summed over
    ranks count each validation sample once. Ranks may get one sample more or fewer, which is
    safe because evaluation runs no collective per batch.

    list(EvalSampler(5, rank=1, num_replicas=2))
    [1, 3]
    """

    def __init__(self, length: int, rank: int = 0, num_replicas: int = 1) -> None:
        if not 0 <= rank < num_replicas:
            raise ValueError(f"Invalid rank {rank}, rank should be in the interval [0, {num_replicas - 1}]")
        self.length, self.rank, self.num_replicas = length, rank, num_replicas

    def __iter__(self):
        return iter(range(self.rank, self.length, self.num_replicas))

    def __len__(self) -> int:
        return max(0, math.ceil((self.length - self.rank) / self.num_replicas))


def seed_worker(worker_id: int) -> None:
    """``worker_init_fn``: seed NumPy and ``random`` from the worker's torch seed.

    # NOTE [ Different augmentation in every worker, rank and epoch ]
    # The loader's ``generator`` is seeded with seed + rank, and draws a new base seed each
    # time workers start (each epoch, or once with persistent workers whose RNGs then run on);
    # each worker's torch seed is base seed + worker id. Seeding NumPy and ``random`` from it
    # keeps third-party augmentations from repeating the same "random" numbers in every worker.
    """
    seed = torch.initial_seed() % 2**32
    np.random.seed(seed)
    random.seed(seed)


def build_loader(dataset, cfg, split: str, *, rank: int | None = None, world_size: int | None = None):
    """The DataLoader for ``split``, with arguments that mean what DataLoader's mean.

    Args:
        dataset: from :func:`build_dataset`.
        cfg (Config): ``loader.*`` and ``train.seed`` are used.
        split (str): ``"train"`` shuffles, drops the last partial batch (``loader.drop_last``)
            and gives every rank the same number of batches; ``"val"`` reads every sample
            exactly once over all ranks, in order.
        rank, world_size (int, optional): default to the running process group's; pass them
            to simulate a rank in tests.
    """
    if rank is None or world_size is None:
        rank, world_size = dist.get_rank(), dist.get_world_size()
    train = split == "train"
    s = resolve_settings(cfg, dataset, read_tuned(cfg, dataset))
    if isinstance(dataset, IterableDataset):
        # The stream shards itself by rank, then by worker (see stages.py); this loader's copy
        # gets this rank, sharing the epoch counter with the original.
        dataset = copy.copy(dataset)
        dataset.rank, dataset.world_size = rank, world_size
        if hasattr(dataset, "check_loader"):
            dataset.check_loader(s.num_workers, world_size)
        sampler = None
    elif train:
        sampler = ResumableDistributedSampler(
            dataset, num_replicas=world_size, rank=rank, shuffle=True, seed=cfg.train.seed
        )
        batches = len(sampler) // cfg.loader.batch_size if cfg.loader.drop_last else len(sampler)
        if batches == 0:
            raise ValueError(
                f"the train split has {len(dataset)} samples: with loader.batch_size="
                f"{cfg.loader.batch_size} x world size {world_size} and loader.drop_last=true "
                "no batch is left (lower the batch size or add data)"
            )
    else:
        sampler = EvalSampler(len(dataset), rank=rank, num_replicas=world_size)
    workers = s.num_workers > 0
    return DataLoader(
        dataset,
        batch_size=cfg.loader.batch_size,
        sampler=sampler,
        num_workers=s.num_workers,
        collate_fn=getattr(dataset, "collate_fn", None),
        pin_memory=s.pin_memory,
        drop_last=cfg.loader.drop_last if train else False,
        worker_init_fn=seed_worker,
        generator=torch.Generator().manual_seed(cfg.train.seed + 1000 * rank),
        prefetch_factor=s.prefetch_factor if workers else None,
        persistent_workers=s.persistent_workers if workers else False,
    )


def estimated_batches(loader: DataLoader) -> int | None:
    """Batches one epoch of ``loader`` yields on this rank; ``None`` when the source cannot tell.

    For an IterableDataset this is computed from its ``__len__`` per worker (each worker ends
    with its own partial batch) instead of ``len(loader)``, whose single division undercounts.
    A source with ``exact_batches`` (shards with an index) knows the count for the current
    epoch, the same on every rank.
    """
    dataset = loader.dataset
    if not isinstance(dataset, IterableDataset):
        return len(loader)
    if hasattr(dataset, "exact_batches"):
        return dataset.exact_batches(loader.batch_size, loader.num_workers, loader.drop_last)
    try:
        n = len(dataset)
    except TypeError:
        return None
    workers = max(1, loader.num_workers)
    bs = loader.batch_size
    per_worker = [n // workers + (w < n % workers) for w in range(workers)]
    return sum(k // bs if loader.drop_last else math.ceil(k / bs) for k in per_worker)


def set_epoch(loader: DataLoader, epoch: int) -> None:
    """Tell the sampler (and a dataset that shuffles itself) which epoch starts."""
    for obj in (loader.sampler, loader.dataset):
        if hasattr(obj, "set_epoch"):
            obj.set_epoch(epoch)
