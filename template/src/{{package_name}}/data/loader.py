# torchfeed's file: `copier update` replaces it. Your model is model.py; your augmentations, loss and
# metric are task.py; your settings configs/default.yaml (README.md: "Which files are yours").
"""The DataLoader factory: sampler, workers, seeding and batching in one place.

    loader = build_loader(dataset, with_tuned(cfg, dataset), "train")  # tuned settings: data/tuned.py
    for epoch in range(cfg.train.epochs):
        set_epoch(loader, epoch)  # a new order each epoch, on every rank
        for batch in even_batches(loader, planned_batches(loader)): ...

The loader is torchdata's ``StatefulDataLoader``: ``loader.state_dict()`` between batches is
the position in the epoch (sampler, workers and the source's own state), and
``loader.load_state_dict(state)`` continues from it, so a resumed run sees the rest of the
epoch and nothing twice.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import os
import random
import signal
import threading
import time
import warnings
import weakref
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.utils.data import IterableDataset, Sampler, default_collate
from torchdata.stateful_dataloader import StatefulDataLoader, stateful_dataloader
from torchdata.stateful_dataloader.sampler import StatefulDistributedSampler

from .. import dist, handoff, project, shm
from ..errors import DataError, SharedMemoryFull, Stalled, UserError
from .source import Source
from .workers import (  # noqa: F401 (worker_context, worker_processes, seed_worker, exit_with: once this module's)
    exit_with,
    init_worker,
    lost,
    seed_worker,
    start_method,
    stop_signals_blocked,
    unpicklable,
    worker_context,
    worker_processes,
)

log = logging.getLogger(__name__)


@dataclass
class LoaderSettings:
    """The four DataLoader arguments that `bench` tunes, resolved to concrete values."""

    num_workers: int
    prefetch_factor: int
    persistent_workers: bool
    pin_memory: bool


def resolve_settings(cfg, dataset, processes: int | None = None) -> LoaderSettings:
    """Turn ``auto`` values into numbers by the default rule (tuned values are in ``cfg`` already:
    ``tuned.with_tuned`` puts them there once, before any loader is built; no file is read here).

    ``processes``: the training processes of this node (default: ``dist.processes_per_node()``).
    """
    c = cfg.loader

    def pick(name, fallback):
        value = getattr(c, name)
        return value if value != "auto" else fallback

    num_workers = pick("num_workers", max(1, dist.usable_cpus() // (processes or dist.processes_per_node())))
    if not isinstance(dataset, IterableDataset):
        num_workers = min(num_workers, len(dataset))
    elif c.num_workers == "auto" and isinstance(dataset, Source) and dataset.max_workers() is not None:
        num_workers = min(num_workers, max(1, dataset.max_workers()))  # an explicit value is checked instead
    return LoaderSettings(
        num_workers=num_workers,
        prefetch_factor=pick("prefetch_factor", 2),
        persistent_workers=pick("persistent_workers", True),
        pin_memory=pick("pin_memory", torch.cuda.is_available() and project.NUM_GPUS > 0),
    )


class EvalSampler(Sampler[int]):
    """Rank ``r`` of ``w`` gets indices ``r, r + w, r + 2w, ...``: every sample exactly once.

    Unlike :class:`DistributedSampler` it never pads with duplicates, so metrics summed over
    ranks count each validation sample once. Ranks may get one sample more or fewer, which is
    safe because evaluation runs no collective per batch.

    >>> list(EvalSampler(5, rank=1, num_replicas=2))
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


class SkipBadCollate:
    """Batch the good samples with ``collate`` and carry the bad ones' ``(key, reason)`` in ``batch["bad"]``.

    # NOTE [ Bad samples travel with the batch ]
    # A worker process cannot stop the run or keep a count the main process sees, so a
    # sample that fails to read or decode becomes ``{"key", "bad"}`` and rides along with its
    # batch; the training loop counts them in one place (``BadSampleBudget``). A batch whose
    # samples were all bad is ``{"key": [], "bad": [...]}``: it never reaches the model.
    """

    def __init__(self, collate) -> None:
        self.collate = collate

    def __call__(self, samples: list[dict]) -> dict[str, Any]:
        good = [s for s in samples if "bad" not in s]
        try:
            with handoff.collecting() as pool:  # in a worker: its batch goes out in a block it reuses
                batch = self.collate(good) if good else {"key": []}
        except RuntimeError as e:  # no room in /dev/shm (torch's "unable to allocate shared memory")
            if shm.remove_failed(e) is None:
                raise
            raise SharedMemoryFull(shm.no_room_in_worker()) from None
        batch["bad"] = [(s["key"], s["bad"]) for s in samples if "bad" in s]
        return handoff.mark(batch, pool)


TAIL = "tail"  # the key of a worker's last, partial batch, sent unbatched (see JoinTails)


class JoinTails:
    """The collate of an iterable source's training loader: a whole batch is collated in its
    worker; a smaller one, a worker's last, goes to the loader's process unbatched
    (``{TAIL: samples}``) to be joined with the other workers' (see :class:`TailJoiningLoader`)."""

    def __init__(self, collate, batch_size: int) -> None:
        self.collate, self.batch_size = collate, batch_size

    def __call__(self, samples: list[dict]) -> dict[str, Any]:
        return self.collate(samples) if len(samples) >= self.batch_size else {TAIL: samples}


CHECK_S = 5  # seconds between torch's looks at the workers while a batch is awaited (workers.py: NOTE)


class Loader(StatefulDataLoader):
    """torchdata's StatefulDataLoader: its workers get back the shared memory of the batches this process
    is done with (handoff.py: NOTE [ A worker's batches reuse their shared memory ]); a wait for a batch
    looks at the workers every few seconds, so a dead one is named (workers.py: NOTE [ A worker that
    dies is named ]); a mistake a worker found comes out as it was raised there.

    Args:
        split (str): what its messages call it (``"train"``, ``"val"``); the rest are StatefulDataLoader's
            (``timeout``: seconds its workers may send no batch before :class:`Stalled`; 0: forever).
    """

    def __init__(self, *args, split: str = "train", **kwargs) -> None:
        self.split = split
        self.watched: Callable[[], Any] = lambda: None  # the iterator over workers it waits on (weakly)
        super().__init__(*args, **kwargs)

    def _get_iterator(self):
        if self.num_workers == 0 or _WatchfulIterator is None:
            return super()._get_iterator()
        self.check_worker_number_rationality()
        iterator = _WatchfulIterator(self, self.next_iter_state)
        self.next_iter_state = None
        self.watched = weakref.ref(iterator)  # not kept alive: torch ends its workers as it is dropped
        return iterator

    def __iter__(self) -> Iterator[dict]:
        try:
            batches = super().__iter__()  # the workers start here, not at the first batch (signal masks)
        except Exception as e:  # a worker could not get its work (a lambda in a transform), or died starting
            if (problem := _said(self, e)) is e:
                raise
            raise problem from None
        if self.num_workers and _WatchfulIterator is not None:
            _no_raise_on_sigchld()
        return _received(_patient(self, batches))


def _no_raise_on_sigchld() -> None:
    """Take torch's SIGCHLD handler back out of this process, once a loader's wait looks at its workers.

    # NOTE [ A dead worker is named where the loader waits ]
    # For workers it started itself (spawn), torch's handler raises its "DataLoader worker ... is
    # killed by signal" in the main thread wherever that thread is when SIGCHLD comes: in the middle
    # of a checkpoint's write (torch.save then fails on its own half-written file, and its error
    # hides torch's), a collective, the model's step. The loader's wait (_WatchfulIterator) looks
    # at its workers every CHECK_S seconds, forkserver's and spawn's alike: a dead worker is named
    # there, between steps, a few seconds later at most.
    """
    if not hasattr(signal, "SIGCHLD") or threading.current_thread() is not threading.main_thread():
        return
    handler = signal.getsignal(signal.SIGCHLD)
    if getattr(handler, "__module__", None) == "torch.utils.data._utils.signal_handling":
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)


def _watchful(base):
    """torchdata's iterator over workers, whose wait for a batch with a timeout looks at the workers every
    CHECK_S seconds, as torch's does without one (``_try_get_data`` in a loop): torch looks at them
    only once the whole timeout has passed, so a worker killed a minute into a 600 s timeout would
    be named ten minutes later. ``None`` where torchdata has no such iterator: the loaders then wait
    torch's way (a dead worker named once ``loader.timeout_s`` has passed)."""
    if base is None or not all(hasattr(base, name) for name in ("_get_data", "_try_get_data")):
        return None

    class WatchfulIterator(base):
        def _get_data(self):
            if self._timeout <= 0:
                return super()._get_data()
            deadline = time.monotonic() + self._timeout
            while True:  # _try_get_data raises naming the workers that died, after each spell
                success, data = self._try_get_data(max(0.0, min(CHECK_S, deadline - time.monotonic())))
                if success:
                    return data
                if self._pin_memory and not self._pin_memory_thread.is_alive():
                    raise RuntimeError("Pin memory thread exited unexpectedly")
                if time.monotonic() >= deadline:
                    raise RuntimeError(f"DataLoader timed out after {self._timeout} seconds")

    return WatchfulIterator


_WatchfulIterator = _watchful(getattr(stateful_dataloader, "_StatefulMultiProcessingDataLoaderIter", None))


def _patient(loader: Loader, batches: Iterator[dict]) -> Iterator[dict]:
    """``batches``, torch's errors of the workers said in one line (:func:`_said`)."""
    while True:
        try:
            batch = next(batches)
        except StopIteration:
            return
        except Exception as e:
            if (problem := _said(loader, e)) is e:
                raise
            raise problem from None
        yield batch


def _said(loader: Loader, e: Exception) -> Exception:
    """What ``e``, raised while ``loader`` waited for its workers, means in one line (else ``e`` itself):
    a mistake or an outage a worker found, as it was raised there; workers that sent nothing for
    ``loader.timeout_s``; a worker that died (workers.lost); a worker that could not get its work."""
    if isinstance(e, (UserError, Stalled)):
        said = said_in_worker(e)
        return e if said is None else type(e)(said)
    if isinstance(e, RuntimeError) and "DataLoader timed out" in str(e):
        return Stalled(
            f"the {loader.split} loader's workers sent no batch in {loader.timeout} s (loader.timeout_s): one is "
            "stuck (a hung file system or server, a deadlock; `py-spy dump --pid <worker pid>` shows where), or "
            "the data is slower than that: raise loader.timeout_s"
        )
    method = getattr(loader.multiprocessing_context, "get_start_method", lambda: "?")()
    parts = {"dataset": loader.dataset, "collate_fn": loader.collate_fn}
    return lost(e, {loader.split: loader}) or unpicklable(e, loader.split, parts, method) or e


def _received(batches: Iterator[dict]) -> Iterator[dict]:
    yield from map(handoff.received, batches)
    handoff.forget_exited()  # workers that are not persistent have exited: their blocks are unmapped here


class TailJoiningLoader(Loader):
    """The training loader of an iterable source: the workers' last, partial batches are joined.

    # NOTE [ Workers' last batches join up ]
    # Each worker batches its own rows, so with drop_last every worker would drop its last
    # partial batch: up to (batch_size - 1) x workers samples an epoch (batch 64, 2 workers: 512
    # of 600 rows trained). Here each worker sends its last batch unbatched, and this process
    # joins them into whole batches as they come; only what is left at the end (fewer than
    # batch_size samples a rank) is dropped (``drop_last``) or yielded as one smaller batch.
    # A checkpoint written while tails wait to be joined (at an epoch's very end) does not hold
    # them: a run resumed from it trains the epoch without those few samples.
    """

    def __init__(self, *args, drop_joined_last: bool, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.drop_joined_last = drop_joined_last

    def __iter__(self) -> Iterator[dict]:
        return _join_tails(super().__iter__(), self.collate_fn.collate, self.batch_size, self.drop_joined_last)


def _join_tails(batches: Iterable[dict], collate, batch_size: int, drop_last: bool) -> Iterator[dict]:
    tail: list[dict] = []
    for batch in batches:
        if TAIL not in batch:
            yield batch
            continue
        tail += batch[TAIL]
        while len(tail) >= batch_size:
            yield collate(tail[:batch_size])
            tail = tail[batch_size:]
    if tail and not drop_last:
        yield collate(tail)


def build_loader(
    dataset,
    cfg,
    split: str,
    *,
    rank: int | None = None,
    world_size: int | None = None,
    collate_fn=None,
    shm_blocks: int | None = None,
) -> StatefulDataLoader:
    """The loader of ``split``, with arguments that mean what DataLoader's mean.

    Args:
        dataset: a source from ``build_dataset`` (or any Dataset of sample dicts).
        cfg (Config): ``loader.*`` and ``train.seed`` are used.
        split (str): ``"train"`` shuffles, drops the last partial batch (``loader.drop_last``)
            and gives every rank the same number of batches; ``"val"`` reads every sample
            exactly once over all ranks, in order.
        rank, world_size (int, optional): for a map-style dataset, the share its sampler
            reads; default: the source's own, else the running process group's.
        collate_fn (callable, optional): default: the source's ``task.collate``, skipping bad
            samples (:class:`SkipBadCollate`); torch's ``default_collate`` for other datasets.
        shm_blocks (int, optional): the blocks a worker's hand-off pool may keep in /dev/shm
            (:func:`plan_shared_memory` of this loader and the others it runs beside); default:
            what fits for this loader alone. Raises :class:`SharedMemoryFull` when its workers
            cannot run in /dev/shm even without a pool.
    """
    if isinstance(dataset, Source):
        if rank is None or world_size is None:
            rank, world_size = dataset.rank, dataset.world_size
        elif isinstance(dataset, IterableDataset) and (rank, world_size) != (dataset.rank, dataset.world_size):
            raise ValueError(
                f"the source was opened for rank {dataset.rank} of {dataset.world_size}, not {rank} of {world_size}: "
                f"build_dataset(cfg, split, rank={rank}, world_size={world_size})"
            )
        collate_fn = collate_fn or SkipBadCollate(dataset.task.collate)
    else:
        if rank is None or world_size is None:
            rank, world_size = dist.get_rank(), dist.get_world_size()
        collate_fn = collate_fn or default_collate
    train = split == "train"
    s = resolve_settings(cfg, dataset)  # configs/tuned.yaml is applied once, before (tuned.with_tuned)
    if isinstance(dataset, IterableDataset):
        if isinstance(dataset, Source) and train:
            dataset.check_workers(s.num_workers)
        sampler = None
    elif train:
        sampler = StatefulDistributedSampler(dataset, num_replicas=world_size, rank=rank, seed=cfg.train.seed)
        batches = len(sampler) // cfg.loader.batch_size if cfg.loader.drop_last else len(sampler)
        if batches == 0:
            raise UserError(
                f"the train split has {len(dataset)} samples: with loader.batch_size={cfg.loader.batch_size} x "
                f"world size {world_size} and loader.drop_last=true no batch is left (lower the batch size or add data)"
            )
    else:
        sampler = EvalSampler(len(dataset), rank=rank, num_replicas=world_size)
    workers = s.num_workers > 0
    if workers and shm_blocks is None:
        shm_blocks = plan_shared_memory([(dataset, cfg, split)])[0]
    drop_last = cfg.loader.drop_last if train else False
    loader_class, extra = Loader, {}
    if train and isinstance(dataset, IterableDataset) and isinstance(dataset, Source):
        loader_class, extra = TailJoiningLoader, {"drop_joined_last": drop_last}
        collate_fn, drop_last = JoinTails(collate_fn, cfg.loader.batch_size), False
    with warnings.catch_warnings():  # torchdata calls torch.set_vital, which torch deprecates: not the user's concern
        warnings.filterwarnings("ignore", message="'set_vital' is deprecated", category=UserWarning)
        return loader_class(
            dataset,
            **extra,
            batch_size=cfg.loader.batch_size,
            sampler=sampler,
            num_workers=s.num_workers,
            collate_fn=collate_fn,
            pin_memory=s.pin_memory,
            drop_last=drop_last,
            worker_init_fn=functools.partial(init_worker, os.getpid(), blocks=shm_blocks or 0),
            generator=torch.Generator().manual_seed(cfg.train.seed + 1000 * rank),
            prefetch_factor=s.prefetch_factor if workers else None,
            # Validation workers start for each evaluation and end after it: kept, they would sit
            # idle through every training epoch, each a process holding its own memory.
            persistent_workers=s.persistent_workers if workers and train else False,
            multiprocessing_context=worker_context(cfg.loader.start_method) if workers else None,
            timeout=cfg.loader.timeout_s if workers else 0,
            split=split,
        )


def plan_shared_memory(loaders: list[tuple[Any, Any, str]], processes: int | None = None) -> list[int]:
    """The blocks a worker of each loader may keep in its hand-off pool, the loaders (``(dataset, cfg,
    split)`` each, as :func:`build_loader` gets them) of this node's ``processes`` training processes
    sharing /dev/shm (default: ``dist.processes_per_node()``): what fits beside the others, down to 0
    (torch's own way). shm.py's NOTE gives the rule; blocks that ended processes of this project
    left there are removed first.

    Raises :class:`SharedMemoryFull` (one line: /dev/shm's size, what the settings need, the fixes)
    when a loader's workers cannot run there even without a pool.
    """
    handoff.forget_exited()  # the blocks of workers that ended are free, before /dev/shm's room is read
    room = shm.space()
    if room is None:  # no /dev/shm (macOS, Windows): no limit of this kind
        return [handoff.MOST_BLOCKS] * len(loaders)
    files, size = shm.clear_dead(project.PACKAGE)
    if files:
        where = (files, shm.mb(size), shm.PATH)
        log.warning("removed %d block(s) (%s) that ended processes of this project left in %s", *where)
        room = shm.space() or room
    processes = processes or dist.processes_per_node()
    demands = [_demand(dataset, cfg, split, processes) for dataset, cfg, split in loaders]
    blocks = shm.plan(demands, room, handoff.MOST_BLOCKS, processes)
    short = [f"{n} for {d.name}" for d, n in zip(demands, blocks) if d.workers and n < handoff.MOST_BLOCKS]
    if short:
        _say_once(
            f"/dev/shm holds {shm.mb(room.size)} ({shm.mb(room.free)} free): a worker's hand-off pool keeps "
            f"{' and '.join(short)} of its {handoff.MOST_BLOCKS} blocks (0: torch's own way, a new block for "
            f"each batch, slower); for full speed {shm.fixes(shm.full(demands, handoff.MOST_BLOCKS, processes))}"
        )
    return blocks


_logged: set[str] = set()


def _say_once(line: str) -> None:
    if line not in _logged:
        _logged.add(line)
        log.info("%s", line)


def shm_need(dataset, cfg, split: str) -> float:
    """The MB of /dev/shm a loader of ``dataset`` at ``cfg``'s settings needs at the least (no pool)."""
    return round(_demand(dataset, cfg, split, dist.processes_per_node()).need() / 1e6, 1)


def _demand(dataset, cfg, split: str, processes: int) -> shm.Demand:
    """What a loader of ``dataset`` at ``cfg``'s settings keeps in /dev/shm (shm.Demand)."""
    s = resolve_settings(cfg, dataset, processes)
    nbytes = batch_bytes(dataset, cfg.loader.batch_size) if s.num_workers else 0
    return shm.Demand(
        name=f"the {split} loader",
        batch_bytes=nbytes,
        workers=s.num_workers,
        prefetch=s.prefetch_factor,
        persistent=s.persistent_workers and split == "train",  # validation workers end with each evaluation
        batch=f"loader.batch_size={cfg.loader.batch_size}, {shm.mb(nbytes / cfg.loader.batch_size)} a sample",
    )


def batch_bytes(dataset, batch_size: int) -> int:
    """The shared memory one batch of ``batch_size`` takes, from a few of the source's first samples read
    with its task (``task.batch_nbytes``), the random generators left as they were; 0 when unknown (a
    dataset that is not a :class:`Source`, or none of the first samples reads)."""
    if not isinstance(dataset, Source):
        return 0
    samples = []
    with _generators_kept():
        for data in dataset.peek(16):
            try:
                samples.append({"input": dataset.transformed("", dataset.task, data), "target": 0, "key": ""})
            except Exception:  # a bad sample: the next one may do
                continue
            if len(samples) == min(batch_size, 4):
                break
    return dataset.task.batch_nbytes(samples, batch_size) if samples else 0


@contextlib.contextmanager
def _generators_kept() -> Iterator[None]:
    """Torch's, NumPy's and Python's generators as they were after the block (a transform may draw)."""
    states = torch.get_rng_state(), np.random.get_state(), random.getstate()
    try:
        yield
    finally:
        torch.set_rng_state(states[0])
        np.random.set_state(states[1])
        random.setstate(states[2])


def batches(loader, split: str) -> Iterator[dict]:
    """``loader``'s batches, its workers started with the stop signals blocked (workers.py).

    # NOTE [ A stuck worker is an error, not a hang ]
    # A worker blocked for good (a hung network file system or server, a deadlock) would
    # otherwise keep its rank waiting forever, and the other ranks in their next collective:
    # workers that send no batch for ``loader.timeout_s`` are a :class:`Stalled` naming the loader
    # (:class:`Loader`). A mistake or an outage a worker found (a :class:`UserError`, a
    # :class:`Stalled`) comes out as it was raised there, without the traceback torch adds.
    """
    with stop_signals_blocked():  # spawned workers inherit the mask (see worker_context)
        iterator = iter(loader)
    yield from iterator


def said_in_worker(e: Exception) -> str | None:
    """The message of an exception a loader worker raised, without the traceback torch adds (else None).

    >>> said_in_worker(ValueError("Caught ValueError in DataLoader worker process 0.\\nOriginal Traceback "
    ...     "(most recent call last):\\n  File ...\\nValueError: no such file\\n"))
    'no such file'
    """
    text = str(e)
    if not text.startswith(f"Caught {type(e).__name__} in DataLoader worker process"):
        return None
    for name in (f"{type(e).__module__}.{type(e).__qualname__}", type(e).__qualname__):
        head, found, said = text.rpartition(f"\n{name}: ")
        if found:
            return said.rstrip("\n")
    return None


def set_epoch(loader, epoch: int) -> None:
    """Tell the sampler, or a source that orders itself, which epoch starts."""
    if isinstance(loader.sampler, StatefulDistributedSampler):
        loader.sampler.set_epoch(epoch)
    if isinstance(loader.dataset, Source):
        loader.dataset.set_epoch(epoch)


def planned_batches(loader) -> int | None:
    """Batches every rank gets this epoch (the same number on all); ``None`` when the source cannot tell.

    Call it after :func:`set_epoch`: a source's plan may change with the epoch.
    """
    dataset = loader.dataset
    if not isinstance(dataset, IterableDataset):
        return len(loader)
    if isinstance(loader, TailJoiningLoader):
        return dataset.planned_batches(loader.batch_size, loader.num_workers, loader.drop_joined_last)
    return None


def even_batches(batches: Iterable[dict], planned: int | None) -> Iterator[dict | None]:
    """Exactly ``planned`` items, so that every rank takes the same number of steps.

    The loader's batches come first; should it run dry early (a broken file, samples removed
    under the run), ``None`` fills the rest and the step runs on a stand-in with zero weight;
    short by more than a tenth of the epoch (and 2 batches), it is a :class:`DataError`. When
    ``planned`` is ``None`` (a source that cannot count its rows), all ranks stop together at
    the first rank's end, agreed by one collective per batch on a CPU group (no device sync).
    """
    if planned is None:
        yield from dist.stop_together(batches)
        return
    it = iter(batches)
    for done in range(planned):
        batch = next(it, None)
        if batch is None:
            short, most = planned - done, max(2, planned // 10)
            if short > most:  # not a few bad samples or a broken file: the counts are wrong
                raise DataError(
                    f"the loader ran dry after {done} of {planned} planned batches: {short} short, more than the "
                    f"{most} stand-in steps that may fill an epoch; the data holds far fewer samples than its counts "
                    "say (an index that overstates them, samples removed while training): fix the counts or the "
                    "data, and run again"
                )
            log.warning(
                "the loader ran dry after %d of %d planned batches: stand-in steps fill the rest", done, planned
            )
            yield from (None for _ in range(planned - done))
            return
        yield batch
