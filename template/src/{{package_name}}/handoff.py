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
# prefetch_factor 2; at most ``MOST_BLOCKS``, fewer or none where /dev/shm is small: shm.py) and
# stacks a batch (:func:`stack`) into one the training process no longer uses. Each block has a
# flag in a small shared array of the worker's: the worker sets it when it hands the block over;
# the training process clears it once no tensor there uses the block's memory any more (looked at
# each time a loader yields: :func:`received`).
# A view of a batch that outlives it keeps its block, so nothing is overwritten under it; a batch
# the loader drops unseen (an epoch ended early) gives its block back too. A worker that finds no
# free block (the training process holds its batches) stacks into a new one, as
# ``default_collate`` would: it never waits. A batch sent on to another process must be cloned
# first: that process's use is not seen.
#
# NOTE [ A block is sent once ]
# torch sends a shared tensor to another process as a file descriptor, through a socket to a
# thread of the sender and back, for every batch (3 a batch here: the block, the flags, the
# targets): half the training process's CPU for the cache loader, and a thread of the worker woken
# each time. The training process instead keeps each worker's blocks mapped from the first batch
# that brings one (and the flags with the pool's first batch); a later batch names its block
# (pool, index, generation) and the tensor's layout. A block is the worker's to fill again once
# this process's only reference to it is its own map of it (the storage's use count). The maps of
# a worker that has exited are dropped when a new pool appears and when a loader's epoch ends
# (:func:`forget_exited`). A tensor of a batch, or a view of one, keeps its block; a storage object
# alone (``x.untyped_storage()`` kept, the tensors dropped) does not: keep a tensor, or clone.
# Small tensors (the targets) travel by value. Side by side (4 alternating rounds of torchfeed's
# benchmarks/probe.py), the cache loader gives 1.18x the samples/s this way.
#
# NOTE [ Crops are written where their batch goes ]
# A worker's image crops each went to a new tensor on the heap (cold memory: 64 of them a batch),
# which the batch then copied into its block. When a map-style source fetches a train batch and
# the train transform is the project's crop (sample_format.fetch), the worker reserves a block
# first (:func:`reserve`) and each crop writes into its row there; :func:`stack` finds its tensors
# are those rows, in order, and hands the block over without a copy. Otherwise the batch stacks as
# before, into a free block, and the reserved one is given up: free again if nothing was written
# there (a transform of yours made new tensors), dropped from the pool if crops on it are still in
# use (a bad sample left a row unused; a collate of yours that sends the samples as they are:
# torch sends them as their own shared memory, which this pool must never write again). Side by
# side (3 alternating rounds of torchfeed's benchmarks/probe.py), the cache loader gives 1.16x the
# samples/s this way.
"""

from __future__ import annotations

import contextlib
import math
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch
from torch.utils.data import default_collate, get_worker_info

from . import shm

MOST_BLOCKS = 8  # a worker's: its batches in flight (prefetch_factor) and those the training process holds
BY_VALUE_BYTES = 1 << 16  # a smaller tensor of a handed batch is pickled by value, not shared
_use_count = getattr(torch._C, "_storage_Use_Count", None)  # without it (another torch), no pool


class Pool:
    """The blocks of one loader worker (at most ``most``), and their flags (1: handed over, maybe still in use)."""

    def __init__(self, most: int = MOST_BLOCKS) -> None:
        self.most = most
        self.pid = os.getpid()
        self.ident = os.urandom(8).hex()  # names this pool in the training process (a pid is reused)
        self.blocks: list[torch.UntypedStorage | None] = []
        self.generation: list[int] = []  # a block's, counted up each time its index gets a new one
        self.sent: list[int] = []  # the generation of each block the training process has mapped (-1: none)
        self.flags = torch.zeros(max(1, most), dtype=torch.uint8).share_memory_()
        self.free = self.flags.numpy()  # the same memory, read without a tensor op each time
        self.flags_sent = False
        self.handed: list[tuple[int, int]] | None = None  # (block, data_ptr) of the batch being collated
        self.last: list[tuple[int, int]] | None = None  # those of the batch just collated, for mark
        self.reserved: tuple[int, torch.Tensor] | None = None  # a block the next batch's samples are written in
        self.reserving = True  # False once a batch went out without collecting() (see reserve)

    def take(self, nbytes: int) -> int | None:
        """A block of at least ``nbytes`` the training process does not hold, flagged as handed; or ``None``."""
        free = [i for i, block in enumerate(self.blocks) if not self.free[i] and _unused_here(block)]
        fits = [i for i in free if self.blocks[i] is not None and self.blocks[i].nbytes() >= nbytes]
        if fits:
            i = fits[0]
        elif free or len(self.blocks) < self.most:
            i = free[0] if free else len(self.blocks)
            try:
                block = torch.UntypedStorage._new_shared(nbytes)
            except RuntimeError as e:  # /dev/shm is full: no new block (torch's own way may still find room)
                if shm.remove_failed(e) is None:
                    raise
                return None
            self.put(i, block)
        else:
            return None
        self.free[i] = 1
        return i

    def put(self, i: int, block: torch.UntypedStorage | None) -> None:
        """Block ``i`` is ``block`` now (``None``: dropped); the training process maps it with the next batch."""
        if i == len(self.blocks):
            self.blocks.append(None)
            self.generation.append(-1)
            self.sent.append(-1)
        self.blocks[i] = block
        self.generation[i] += 1


def _unused_here(block: torch.UntypedStorage | None) -> bool:
    """No tensor of this worker uses ``block`` (a collate of yours may keep a batch: it is not overwritten)."""
    return block is None or _use_count(block._cdata) <= 1


_pool: Pool | None = None
_most = MOST_BLOCKS  # the blocks a pool of this process may keep (set_most: what fits in /dev/shm)


def set_most(blocks: int) -> None:
    """In a loader worker, before its first batch: its pool keeps at most ``blocks`` (0: no pool, torch's
    own way; the loader sizes it to what fits in /dev/shm, shm.py)."""
    global _most
    _most = blocks


def _worker_pool() -> Pool | None:
    """This loader worker's pool (``None`` outside a worker, without a use count to watch blocks by, or
    when /dev/shm has no room for one)."""
    global _pool
    if get_worker_info() is None or _use_count is None or _most < 1:
        return None
    if _pool is None or _pool.pid != os.getpid():  # a worker's own (a fork carries none worth keeping)
        try:
            _pool = Pool(_most)
        except RuntimeError as e:  # no room in /dev/shm even for its flags: torch's own way
            if shm.remove_failed(e) is None:
                raise
            set_most(0)
            return None
    return _pool


def _unreserve(pool: Pool, *, collated: bool = True) -> None:
    """Give up the reserved block, which no batch took: free again if no tensor uses it; dropped from
    the pool if one does (a sample on it may leave in a batch of a collate's own, as torch sends it,
    like a block :func:`mark` finds unnamed), or if the batch it was for was never collated here
    (``collated=False``: it may have gone already; this worker reserves no more blocks)."""
    if pool.reserved is None:
        return
    i = pool.reserved[0]
    pool.reserved = None
    if not collated or not _unused_here(pool.blocks[i]):
        pool.put(i, None)
    pool.free[i] = 0


@contextlib.contextmanager
def collecting() -> Iterator[Pool | None]:
    """While one batch is collated in a loader worker: :func:`stack` fills the blocks of its pool.

    Yields the pool (``None`` outside a worker); :func:`mark` then tells the batch which blocks it holds.
    """
    pool = _worker_pool()
    if pool is None:
        yield None
        return
    pool.handed = []
    try:
        yield pool
    except BaseException:
        for i, _ in pool.handed:  # the batch is not sent: its blocks are free again
            pool.free[i] = 0
        pool.handed = None
        raise
    finally:
        _unreserve(pool)
    pool.last, pool.handed = pool.handed, None


def reserve(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor | None:
    """In a loader worker: a tensor of ``shape`` in a free block of its pool, for the next batch's
    samples to be written in, row by row (NOTE [ Crops are written where their batch goes ]); or ``None``.

    :func:`stack` hands the block over when the tensors it stacks are its first rows, in order.
    """
    pool = _worker_pool()
    if pool is None or not pool.reserving:
        return None
    if pool.reserved is not None:  # its batch was not collated in collecting(): a collate_fn of yours
        _unreserve(pool, collated=False)
        pool.reserving = False
        return None
    i = pool.take(math.prod(shape) * dtype.itemsize)
    if i is None:
        return None
    rows = torch.empty(0, dtype=dtype).set_(pool.blocks[i], 0, shape)
    pool.reserved = (i, rows)
    return rows


def stack(tensors: list[torch.Tensor]) -> torch.Tensor:
    """``default_collate`` of same-shaped tensors: one tensor, its first dimension the list's.

    While a loader worker collates a batch (:func:`collecting`), into a free block of its pool.
    """
    pool = _pool
    if pool is None or pool.handed is None or pool.pid != os.getpid():
        return default_collate(tensors)
    if pool.reserved is not None:
        i, rows = pool.reserved
        if _are_rows(tensors, rows):  # written in place: the block goes as it is
            pool.reserved = None
            pool.handed.append((i, pool.blocks[i].data_ptr()))
            return rows[: len(tensors)]
        on_it = any(t.untyped_storage().data_ptr() == rows.data_ptr() for t in tensors)
        del rows
        if on_it:  # crops of a batch with a bad sample amid them: given up (collecting settles it otherwise)
            _unreserve(pool)
    first = tensors[0]
    shape = (len(tensors), *first.shape)
    i = pool.take(math.prod(shape) * first.element_size())
    if i is None:
        return default_collate(tensors)
    pool.handed.append((i, pool.blocks[i].data_ptr()))  # first: a failure from here frees the block (collecting)
    return torch.stack(tensors, out=first.new_empty(0).set_(pool.blocks[i], 0, shape))


def nbytes(batch) -> int:
    """The bytes of the tensors in ``batch`` (a tensor, or dicts and lists of them).

    >>> nbytes({"input": torch.zeros(2, 3, dtype=torch.uint8), "key": ["a", "b"], "more": [torch.zeros(1)]})
    10
    """
    if isinstance(batch, torch.Tensor):
        return batch.nbytes
    if isinstance(batch, dict):
        return sum(nbytes(v) for v in batch.values())
    if isinstance(batch, (list, tuple)):
        return sum(nbytes(v) for v in batch)
    return 0


def _are_rows(tensors: list[torch.Tensor], rows: torch.Tensor) -> bool:
    """``tensors`` are the first rows of ``rows``, in order (the same memory, shape, strides and dtype)."""
    start, step = rows.data_ptr(), rows.stride(0) * rows.element_size()  # row k starts at start + k * step
    return len(tensors) <= len(rows) and all(
        type(t) is torch.Tensor
        and t.dtype == rows.dtype
        and t.shape == rows.shape[1:]
        and t.stride() == rows.stride()[1:]
        and t.data_ptr() == start + k * step
        for k, t in enumerate(tensors)
    )


@dataclass
class _InBlock:
    """A tensor of a handed batch, by where it lies: block ``i`` of its pool, with the block itself
    the first time the training process sees this generation of it."""

    i: int
    generation: int
    block: torch.UntypedStorage | None
    dtype: torch.dtype
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int


class HandedBatch(dict):
    """A worker's batch whose tensors under some keys live in its pool's blocks (see :func:`mark`).

    Pickled to the training process, it names those blocks (NOTE [ A block is sent once ]) and
    sends its small tensors by value; unpickled there it is a plain dict (:func:`_unpickled`).
    """

    where: tuple[Pool, dict[str, int]]  # the pool, and the block each such key's tensor lies in

    def __reduce__(self):
        pool, blocks = self.where
        items = []
        for key, value in self.items():
            if key in blocks:
                i = blocks[key]
                first = pool.sent[i] != pool.generation[i]
                pool.sent[i] = pool.generation[i]
                value = _InBlock(
                    i,
                    pool.generation[i],
                    pool.blocks[i] if first else None,
                    value.dtype,
                    tuple(value.shape),
                    value.stride(),
                    value.storage_offset(),
                )
            elif _by_value(value):
                value = _Value(value.numpy())
            items.append((key, value))
        flags = None if pool.flags_sent else pool.flags
        pool.flags_sent = True
        return _unpickled, (pool.ident, pool.pid, flags, items)


@dataclass
class _Value:
    """A small tensor pickled by value (a shared one would cost a file descriptor's round trip)."""

    array: object

    def tensor(self) -> torch.Tensor:
        return torch.from_numpy(self.array)


def _by_value(value) -> bool:
    if type(value) is not torch.Tensor or value.device.type != "cpu" or value.requires_grad:
        return False
    if value.nbytes > BY_VALUE_BYTES or value.layout != torch.strided or not value.is_contiguous():
        return False
    try:
        value.numpy()
    except (TypeError, RuntimeError):  # a dtype numpy lacks (bfloat16, ...): shared as torch does
        return False
    return True


def mark(batch: dict, pool: Pool | None) -> dict:
    """``batch``, telling the training process which of its tensors are in the pool's blocks.

    A block is named where a top-level tensor (not a subclass) of a plain dict starts at it; other
    tensors of the batch go as torch sends them, and one in a named block (a view, the same tensor
    under another key) becomes a tensor of the same map there (torch maps a shared file once per
    process). A block no such tensor starts at (a collate that kept only part of it), or any block
    of a batch that is not a plain dict (its type is kept), is dropped from the pool: it goes out
    as a new block would, and is never written again.
    """
    handed = getattr(pool, "last", None)
    if not handed:
        return batch
    pool.last = None
    where = {t.data_ptr(): key for key, t in batch.items() if type(t) is torch.Tensor} if type(batch) is dict else {}
    blocks = {}
    for i, ptr in handed:
        if ptr in where:
            blocks[where[ptr]] = i
        else:
            pool.put(i, None)
            pool.free[i] = 0
    if not blocks:
        return batch
    marked = HandedBatch(batch)
    marked.where = (pool, blocks)
    return marked


@dataclass
class _Remote:
    """A worker's pool as the training process sees it: the blocks it has mapped, and which it watches."""

    pid: int
    flags: torch.Tensor
    blocks: dict[int, tuple[int, torch.UntypedStorage]] = field(default_factory=dict)  # i -> (generation, block)
    watched: set[int] = field(default_factory=set)  # handed over, not given back yet


# The training process's pools, by ident; touched by the thread that unpickles (the loader's, or
# its pin-memory thread) and the one that iterates.
_pools: dict[str, _Remote] = {}
_lock = threading.Lock()


def _unpickled(ident: str, pid: int, flags: torch.Tensor | None, items: list) -> dict:
    """A handed batch in the training process: a plain dict whose block tensors lie in this process's
    maps of the worker's blocks (each then watched until no tensor here uses it)."""
    with _lock:
        pool = _pools.get(ident)
        if pool is None:
            if flags is None:
                raise RuntimeError(f"loader worker {pid}'s first batch never arrived here (its stderr may say why)")
            _forget_exited()
            pool = _pools[ident] = _Remote(pid, flags)
        batch = {}
        for key, value in items:
            if isinstance(value, _InBlock):
                if value.block is not None:
                    pool.blocks[value.i] = (value.generation, value.block)
                generation, block = pool.blocks.get(value.i, (None, None))
                if generation != value.generation:  # the batch that brought it was lost: not pickled, say
                    raise RuntimeError(f"a batch of loader worker {pid} never arrived here (its stderr may say why)")
                pool.watched.add(value.i)
                value = torch.empty(0, dtype=value.dtype).set_(block, value.offset, value.shape, value.stride)
            elif isinstance(value, _Value):
                value = value.tensor()
            batch[key] = value
    return batch


def received(batch):
    """What a loader yields (data/loader.py: Loader), unchanged; meanwhile every block no tensor of
    this process uses any more goes back to its worker (its flag cleared)."""
    with _lock:
        for pool in _pools.values():
            for i in [i for i in pool.watched if _use_count(pool.blocks[i][1]._cdata) <= 1]:
                pool.watched.discard(i)
                pool.flags[i] = 0
    return batch


def forget_exited() -> None:
    """Unmap the blocks of loader workers that have exited (tensors of theirs still used keep theirs)."""
    with _lock:
        _forget_exited()


def _forget_exited() -> None:
    for ident in [ident for ident, pool in _pools.items() if not shm.alive(pool.pid)]:
        del _pools[ident]
