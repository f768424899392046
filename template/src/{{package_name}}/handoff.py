# torchfeed's file: `copier update` replaces it. Your model is model.py; your augmentations, loss and
# metric are task.py; your settings configs/default.yaml (README.md: "Which files are yours").
"""A loader worker's hand-off of its batches: shared-memory blocks it fills again once they are free.

# NOTE [ A worker's batches reuse their shared memory ]
# In a loader worker, ``default_collate`` stacks each batch into a new shared-memory block, which
# the training process then maps. The kernel allocates and zeroes every 4 KiB page of a new block
# at its first write (shared memory gets no huge pages on most systems): 4.1 ms for a batch of 64
# samples of 3 x 224 x 224 bytes against 0.7 ms into memory already mapped, a sixth of the cache
# loader's work (benchmarks/loaders.py, "a worker's hand-off of a batch"). Here a worker keeps the
# blocks it needed at once (its batches in flight and those the training process holds: 3 with
# prefetch_factor 2; at most ``MOST_BLOCKS``) and stacks a batch (:func:`stack`) into one the
# training process no longer holds. Each block has a flag in a small shared array of the worker's:
# the worker sets it when it hands the block over; the training process clears it once no tensor
# there uses the block's memory any more (a weak reference to its storage, taken as the batch is
# unpickled there and looked at each time a loader yields: :func:`received`). A view of a batch
# that outlives it keeps its block, so nothing is overwritten under it; a batch the loader drops
# unseen (an epoch ended early) gives its block back too. A worker that finds no free block (the
# training process holds its batches) stacks into a new one, as ``default_collate`` would: it
# never waits. A batch sent on to another process must be cloned first: that process's use is
# not seen.
"""

from __future__ import annotations

import contextlib
import math
import os
import threading
from collections.abc import Iterator

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils.data import default_collate, get_worker_info

MOST_BLOCKS = 8  # a worker's: its batches in flight (prefetch_factor) and those the training process holds


class Pool:
    """The blocks of one loader worker, and their flags (1: handed over, maybe still in use)."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.blocks: list[torch.UntypedStorage | None] = []
        self.flags = torch.zeros(MOST_BLOCKS, dtype=torch.uint8).share_memory_()
        self.free = self.flags.numpy()  # the same memory, read without a tensor op each time
        self.handed: list[tuple[int, int]] | None = None  # (block, data_ptr) of the batch being collated
        self.last: list[tuple[int, int]] | None = None  # those of the batch just collated, for mark

    def take(self, nbytes: int) -> int | None:
        """A block of at least ``nbytes`` the training process does not hold, flagged as handed; or ``None``."""
        free = [i for i, block in enumerate(self.blocks) if not self.free[i] and _unused_here(block)]
        fits = [i for i in free if self.blocks[i] is not None and self.blocks[i].nbytes() >= nbytes]
        if fits:
            i = fits[0]
        elif free or len(self.blocks) < MOST_BLOCKS:
            i = free[0] if free else len(self.blocks)
            block = torch.UntypedStorage._new_shared(nbytes)
            self.blocks[i : i + 1] = [block]
        else:
            return None
        self.free[i] = 1
        return i


def _unused_here(block: torch.UntypedStorage | None) -> bool:
    """No tensor of this worker uses ``block`` (a collate of yours may keep a batch: it is not overwritten)."""
    count = getattr(torch._C, "_storage_Use_Count", None)
    return block is None or count is None or count(block._cdata) <= 1


_pool: Pool | None = None


@contextlib.contextmanager
def collecting() -> Iterator[Pool | None]:
    """While one batch is collated in a loader worker: :func:`stack` fills the blocks of its pool.

    Yields the pool (``None`` outside a worker); :func:`mark` then tells the batch which blocks it holds.
    """
    global _pool
    if get_worker_info() is None:
        yield None
        return
    if _pool is None or _pool.pid != os.getpid():  # a worker's own (a fork carries none worth keeping)
        _pool = Pool()
    _pool.handed = []
    try:
        yield _pool
    except BaseException:
        for i, _ in _pool.handed:  # the batch is not sent: its blocks are free again
            _pool.free[i] = 0
        _pool.handed = None
        raise
    _pool.last, _pool.handed = _pool.handed, None


def stack(tensors: list[torch.Tensor]) -> torch.Tensor:
    """``default_collate`` of same-shaped tensors: one tensor, its first dimension the list's.

    While a loader worker collates a batch (:func:`collecting`), into a free block of its pool.
    """
    pool = _pool
    if pool is None or pool.handed is None or pool.pid != os.getpid():
        return default_collate(tensors)
    first = tensors[0]
    shape = (len(tensors), *first.shape)
    i = pool.take(math.prod(shape) * first.element_size())
    if i is None:
        return default_collate(tensors)
    pool.handed.append((i, pool.blocks[i].data_ptr()))  # first: a failure from here frees the block (collecting)
    return torch.stack(tensors, out=first.new_empty(0).set_(pool.blocks[i], 0, shape))


class HandedBatch(dict):
    """A batch whose tensors under some keys live in a worker's blocks: ``blocks = (flags, [(block, key)])``.

    Unpickled in the training process (by the loader, or its pin-memory thread), it has each block
    watched (:func:`received` gives it back once no tensor there uses it); copied (torch's
    ``pin_memory`` copies a batch, then pins its tensors), it is a plain dict.
    """

    blocks: tuple[torch.Tensor, list[tuple[int, str]]] | None = None

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        flags, found = self.blocks
        with _lock:
            for i, key in found:
                slot = (flags.data_ptr(), i)  # one watch a block: a flag is cleared once per hand-off
                if slot not in _watched:
                    _watched[slot] = (StorageWeakRef(self[key].untyped_storage()), flags, i)

    def __copy__(self) -> dict:
        return dict(self)


def mark(batch: dict, pool: Pool | None) -> dict:
    """``batch``, telling the training process which of its tensors are in the pool's blocks.

    A block no top-level tensor of the batch starts at (a collate that kept only part of it), or
    any block of a batch that is not a plain dict (its type is kept), is dropped from the pool: it
    goes out as a new block would, and is never written again.
    """
    handed = getattr(pool, "last", None)
    if not handed:
        return batch
    pool.last = None
    where = (
        {t.data_ptr(): key for key, t in batch.items() if isinstance(t, torch.Tensor)} if type(batch) is dict else {}
    )
    found = []
    for i, ptr in handed:
        if ptr in where:
            found.append((i, where[ptr]))
        else:
            pool.blocks[i], pool.free[i] = None, 0
    if not found:
        return batch
    marked = HandedBatch(batch)
    marked.blocks = (pool.flags, found)
    return marked


# The training process's watches: (flags' address, block) -> (its storage's weak reference, flags, block).
_watched: dict[tuple[int, int], tuple[StorageWeakRef, torch.Tensor, int]] = {}
_lock = threading.Lock()


def received(batch):
    """What a loader yields (data/loader.py: Loader): ``batch`` as a plain dict; and meanwhile every block
    no tensor of this process uses any more goes back to its worker (its flag cleared)."""
    with _lock:
        done = [slot for slot, (ref, _, _) in _watched.items() if ref.expired()]
        for slot in done:
            _, flags, i = _watched.pop(slot)
            flags[i] = 0
    return dict(batch) if type(batch) is HandedBatch else batch
