# torchfeed's file: `copier update` replaces it. Your model is model.py; your augmentations, loss and
# metric are task.py; your settings configs/default.yaml (README.md: "Which files are yours").
"""A loader worker's pool of shared-memory blocks, filled again once the training process is done with one.

``loader.batch_pool``: off unless `bench` measured it faster on this data and machine (it writes its
figures beside its choice in ``configs/tuned.yaml``). This is the one module of the project that uses
torch beyond its public API (a storage's use count, a shared storage made without a copy, the table
``default_collate`` stacks tensors with); where a torch release lacks one of them, :func:`pooled`
says so in one line and the loader hands batches over torch's own way.

# NOTE [ A worker's batches reuse their shared memory ]
# In a loader worker, ``default_collate`` stacks each batch into a new shared-memory block, which
# torch sends to the training process as a file descriptor, through a socket to a thread of the
# worker and back. The kernel zeroes every 4 KiB page of a new block at its first write, and the
# training process maps each block afresh: for the cache loader at 224 px that is more than its
# workers' own work (benchmarks/results/loaders.md). Here a worker keeps up to ``blocks`` blocks
# and, while it collates a batch (:class:`Pooled`), ``default_collate`` stacks into one the
# training process no longer uses. Each block has a flag in a small shared array of the worker's:
# the worker sets it as it hands the block over; the training process clears it once no tensor
# there uses the block (its storage's use count), looked at as each batch arrives. The training
# process keeps a worker's blocks mapped from the first batch that brings one; a later batch names
# its block (``_InBlock``), and small tensors (the targets) travel by value. A view of a batch
# that outlives it keeps its block, so nothing is overwritten under it; a storage object alone
# (``x.untyped_storage()`` kept, the tensors dropped) does not: keep a tensor, or clone. A worker
# that finds no free block stacks into a new one, as ``default_collate`` would: it never waits.
# A collate of yours that stacks with ``torch.stack`` goes torch's own way, unchanged.
#
# NOTE [ Samples written where their batch goes ]
# A worker's crops each went to new memory, which the batch then copied into its block: a sixth of
# a cached sample's work. Where a map-style source's train transform has ``write_into`` (crops.py's
# crop), the pool gives it, after each batch, the rows of a free block for the next one
# (:meth:`Pool.reserve`): each crop is made in its row, and when the tensors ``default_collate``
# stacks are those rows, in order, the block goes as it is (no copy). Otherwise (a transform of
# yours after the crop, a bad sample whose crop was made) the batch is stacked into a block as
# above, and the reserved one is free again, or dropped from the pool while a sample still uses it.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import os
import threading
import weakref
from dataclasses import dataclass, field

import torch
from torch.utils.data import get_worker_info

log = logging.getLogger(__name__)
BY_VALUE_BYTES = 1 << 16  # a smaller tensor of a handed batch is pickled by value, not shared


@functools.cache
def _private_api():
    """The private parts of torch this needs, or ``None`` where a release lacks one."""
    try:
        from torch.utils.data._utils import collate

        parts = (torch._C._storage_Use_Count, torch.UntypedStorage._new_shared, collate.default_collate_fn_map)
    except (ImportError, AttributeError):
        return None
    return parts if torch.Tensor in parts[2] else None


def pooled(collate, blocks: int):
    """``collate``, its batches stacked into a worker's pool of at most ``blocks`` blocks; ``collate`` itself,
    said in one line, where this torch lacks what the pool needs."""
    if _private_api() is None:
        log.info("loader.batch_pool: torch %s lacks what the pool needs: batches go torch's own way", torch.__version__)
        return collate
    pooled = Pooled(collate, blocks)
    weakref.finalize(pooled, _forget, pooled.ident)  # its loader gone: the blocks its workers sent, unmapped here
    return pooled


class Pooled:
    """A collate_fn whose tensors stacked by ``default_collate`` go into blocks of the worker's pool."""

    def __init__(self, collate, blocks: int) -> None:
        self.collate, self.blocks = collate, blocks
        self.ident = os.urandom(8).hex()  # names its loader's pools in the training process

    def __call__(self, samples):
        pool = _worker_pool(self.blocks, self.ident)
        if pool is None:
            return self.collate(samples)
        table = _private_api()[2]
        pool.original, table[torch.Tensor] = table[torch.Tensor], pool.stack
        pool.handed = []
        try:
            batch = self.collate(samples)
        except BaseException:
            for i, _ in pool.handed:  # the batch is not sent: its blocks are free again
                pool.free[i] = 0
            raise
        finally:
            table[torch.Tensor] = pool.original
            pool.unreserve()
        handed, pool.handed = pool.handed, None
        batch = _mark(batch, pool, handed)
        pool.reserve()  # the next batch's rows, for its samples to be written in
        return batch


class Pool:
    """The blocks of one loader worker (at most ``most``), and their flags (1: handed over, maybe in use)."""

    def __init__(self, most: int, owner: str) -> None:
        self.most, self.pid, self.owner = most, os.getpid(), owner
        self.ident = os.urandom(8).hex()  # names this pool in the training process (a pid is reused)
        self.blocks: list[torch.UntypedStorage | None] = []
        self.generation: list[int] = []  # a block's, counted up each time its index gets a new one
        self.sent: list[int] = []  # the generation the training process has mapped (-1: none)
        self.flags = torch.zeros(max(1, most), dtype=torch.uint8).share_memory_()
        self.free = self.flags.numpy()  # the same memory, read without a tensor op each time
        self.flags_sent = False
        self.handed: list[tuple[int, int]] | None = None  # (block, data_ptr) of the batch being collated
        self.original = None  # default_collate's own way to stack tensors
        self.writer = _row_writer()  # the train transform's write_into, if it has one
        self.largest: tuple[tuple[int, ...], torch.dtype] | None = None  # the largest stacked tensor's
        self.reserved: tuple[int, torch.Tensor] | None = None  # (block, its rows) for the next batch's samples

    def stack(self, batch: list[torch.Tensor], *, collate_fn_map=None) -> torch.Tensor:
        """``default_collate``'s stacking of same-shaped tensors, into a free block of this pool."""
        first = batch[0]
        shape, nbytes = (len(batch), *first.shape), len(batch) * first.numel() * first.element_size()
        if self.handed is not None and (self.largest is None or nbytes > math.prod(self.largest[0])):
            self.largest = (shape, first.dtype)
        if self.reserved is not None and self.handed is not None and _are_rows(batch, self.reserved[1]):
            i, rows = self.reserved  # the samples were written in place: the block goes as it is
            self.unreserve(handed=True)
            return rows[: len(batch)]
        i = self.take(nbytes) if type(first) is torch.Tensor and self.handed is not None else None
        if i is None:
            return self.original(batch, collate_fn_map=collate_fn_map)
        self.handed.append((i, self.blocks[i].data_ptr()))  # first: a failure from here frees the block
        return torch.stack(batch, out=first.new_empty(0).set_(self.blocks[i], 0, shape))

    def reserve(self) -> None:
        """After a batch: rows for the next one's samples, in a free block, given to the train transform's
        ``write_into`` (NOTE [ Samples written where their batch goes ])."""
        if self.writer is None or self.largest is None or self.reserved is not None:
            return
        shape, dtype = self.largest
        i = self.take(math.prod(shape) * dtype.itemsize)
        if i is not None:
            self.reserved = (i, torch.empty(0, dtype=dtype).set_(self.blocks[i], 0, shape))
            self.writer(self.reserved[1])

    def unreserve(self, *, handed: bool = False) -> None:
        """The reserved block is no longer written: handed over with its batch (``handed``), else free again
        if no sample uses it, or dropped from the pool if one still does (it may leave as torch sends it)."""
        if self.reserved is None:
            return
        i, rows = self.reserved
        self.reserved = None
        self.writer(None)
        if handed:
            self.handed.append((i, self.blocks[i].data_ptr()))
            return
        del rows
        if _private_api()[0](self.blocks[i]._cdata) > 1:
            self.put(i, None)
        self.free[i] = 0

    def take(self, nbytes: int) -> int | None:
        """A block of at least ``nbytes`` the training process does not hold, flagged as handed; or ``None``."""
        use_count = _private_api()[0]
        free = [i for i, b in enumerate(self.blocks) if not self.free[i] and (b is None or use_count(b._cdata) <= 1)]
        fits = [i for i in free if self.blocks[i] is not None and self.blocks[i].nbytes() >= nbytes]
        if fits:
            i = fits[0]
        elif free or len(self.blocks) < self.most:
            i = free[0] if free else len(self.blocks)
            try:
                block = torch.UntypedStorage._new_shared(nbytes)
            except RuntimeError:  # /dev/shm is full: torch's own way may still find room, or say so
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


_pool: Pool | None = None


def _worker_pool(blocks: int, owner: str) -> Pool | None:
    """This loader worker's pool (``None`` outside a worker, or when /dev/shm has no room even for its flags)."""
    global _pool
    if get_worker_info() is None or blocks < 1:
        return None
    if _pool is None or _pool.pid != os.getpid():  # a worker's own (a fork carries none worth keeping)
        try:
            _pool = Pool(blocks, owner)
        except RuntimeError:  # no room in /dev/shm even for its flags: torch's own way
            return None
    return _pool


def _row_writer():
    """In a loader worker of a map-style source: its train transform's ``write_into`` (crops.py's crop has
    one), which writes the next samples into given rows; ``None`` where there is none, or where the
    samples may not be collated in the order they are made (an iterable source's buffers)."""
    info = get_worker_info()
    dataset = info.dataset if info is not None else None
    if dataset is None or isinstance(dataset, torch.utils.data.IterableDataset):
        return None
    return getattr(getattr(getattr(dataset, "task", None), "transform", None), "write_into", None)


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
    """A tensor of a handed batch, by where it lies: block ``i`` of its pool (with the block itself the
    first time the training process sees this generation of it)."""

    i: int
    generation: int
    block: torch.UntypedStorage | None
    dtype: torch.dtype
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int


@dataclass
class _Value:
    """A small tensor of a handed batch, pickled by value."""

    array: object


class HandedBatch(dict):
    """A worker's batch whose tensors under some keys lie in its pool's blocks (see :func:`_mark`).

    Pickled to the training process, it names those blocks and sends its small tensors by value;
    unpickled there it is a plain dict (:func:`_unpickled`).
    """

    where: tuple[Pool, dict[str, int]]  # the pool, and the block each such key's tensor lies in

    def __reduce__(self):
        pool, blocks = self.where
        items = []
        for key, value in self.items():
            if key in blocks:
                i = blocks[key]
                first, pool.sent[i] = pool.sent[i] != pool.generation[i], pool.generation[i]
                block = pool.blocks[i] if first else None
                shape, stride, offset = tuple(value.shape), value.stride(), value.storage_offset()
                value = _InBlock(i, pool.generation[i], block, value.dtype, shape, stride, offset)
            elif type(value) is torch.Tensor and value.nbytes <= BY_VALUE_BYTES and value.is_contiguous():
                # a small tensor: by value (shared, it would cost a file descriptor's round trip); a dtype
                # NumPy lacks (bfloat16) goes shared, as torch sends it
                with contextlib.suppress(TypeError, RuntimeError):
                    value = _Value(value.numpy())
            items.append((key, value))
        flags, pool.flags_sent = None if pool.flags_sent else pool.flags, True
        return _unpickled, (pool.ident, pool.pid, flags, items, pool.owner)


def _mark(batch, pool: Pool, handed: list[tuple[int, int]]):
    """``batch``, telling the training process which of its tensors are the pool's blocks.

    A block is named where a top-level tensor of a plain dict starts at it; a block no such tensor
    starts at (a collate that kept only part of it), or any block of a batch that is not a plain
    dict, is dropped from the pool: it goes out as torch sends it, and is never written again.
    """
    where = {t.data_ptr(): k for k, t in batch.items() if type(t) is torch.Tensor} if type(batch) is dict else {}
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
    owner: str  # the Pooled collate (its loader) whose workers' pool this is
    blocks: dict[int, tuple[int, torch.UntypedStorage]] = field(default_factory=dict)  # i -> (generation, block)
    watched: set[int] = field(default_factory=set)  # handed over, not given back yet


# The training process's view of the pools, by ident; touched by the thread that unpickles batches
# (the loader's, or its pin-memory thread).
_pools: dict[str, _Remote] = {}
_lock = threading.Lock()


def _unpickled(ident: str, pid: int, flags: torch.Tensor | None, items: list, owner: str) -> dict:
    """A handed batch in the training process: a plain dict, its block tensors on this process's maps of the
    worker's blocks. Meanwhile every block no tensor here uses any more goes back to its worker."""
    use_count = _private_api()[0]
    with _lock:
        for remote in _pools.values():
            for i in [i for i in remote.watched if use_count(remote.blocks[i][1]._cdata) <= 1]:
                remote.watched.discard(i)
                remote.flags[i] = 0
        pool = _pools.get(ident)
        if pool is None:
            if flags is None:
                raise RuntimeError(f"loader worker {pid}'s first batch never arrived here (its stderr may say why)")
            for gone in [k for k, p in _pools.items() if not _alive(p.pid)]:  # the blocks of workers that ended
                del _pools[gone]
            pool = _pools[ident] = _Remote(pid, flags, owner)
        batch = {}
        for key, value in items:
            if isinstance(value, _InBlock):
                if value.block is not None:
                    pool.blocks[value.i] = (value.generation, value.block)
                generation, block = pool.blocks.get(value.i, (None, None))
                if generation != value.generation:  # the batch that brought it was lost
                    raise RuntimeError(f"a batch of loader worker {pid} never arrived here (its stderr may say why)")
                pool.watched.add(value.i)
                value = torch.empty(0, dtype=value.dtype).set_(block, value.offset, value.shape, value.stride)
            elif isinstance(value, _Value):
                value = torch.from_numpy(value.array)
            batch[key] = value
    return batch


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def _forget(owner: str) -> None:
    """Unmap the blocks of the pools of one loader's workers (its collate is gone); tensors still used keep theirs."""
    with _lock:
        for ident in [i for i, p in _pools.items() if p.owner == owner]:
            del _pools[ident]
