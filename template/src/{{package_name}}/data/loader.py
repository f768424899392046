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

import functools
import logging
import math
import multiprocessing
import multiprocessing.forkserver
import multiprocessing.resource_tracker
import multiprocessing.util
import os
import random
import select
import signal
import threading
import time
import warnings
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import torch
from torch.utils.data import IterableDataset, Sampler, default_collate
from torchdata.stateful_dataloader import StatefulDataLoader
from torchdata.stateful_dataloader.sampler import StatefulDistributedSampler

from .. import dist, handoff, project
from ..errors import DataError, Stalled, UserError
from ..stopping import STOP_SIGNALS
from .source import Source

log = logging.getLogger(__name__)


@dataclass
class LoaderSettings:
    """The four DataLoader arguments that `bench` tunes, resolved to concrete values."""

    num_workers: int
    prefetch_factor: int
    persistent_workers: bool
    pin_memory: bool


def resolve_settings(cfg, dataset) -> LoaderSettings:
    """Turn ``auto`` values into numbers by the default rule (tuned values are in ``cfg`` already:
    ``tuned.with_tuned`` puts them there once, before any loader is built; no file is read here)."""
    c = cfg.loader

    def pick(name, fallback):
        value = getattr(c, name)
        return value if value != "auto" else fallback

    num_workers = pick("num_workers", max(1, dist.usable_cpus() // dist.processes_per_node()))
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


def exit_with(pid: int) -> None:
    """End this process as soon as process ``pid`` ends (a daemon thread waits for it).

    # NOTE [ Workers end with their rank ]
    # DataLoader's workers stop when their parent process changes. A worker started from the
    # forkserver (see worker_context) has the forkserver as its parent, and the forkserver
    # lives while any of its workers does: a rank killed with kill -9 (or by the OOM killer)
    # would leave its workers and forkserver running, and holding memory, forever. So each
    # worker watches its rank itself.
    """
    try:
        handle = os.pidfd_open(pid)  # Linux: readable when the process ends
    except ProcessLookupError:
        os._exit(0)
    except (AttributeError, OSError):
        handle = None

    def wait() -> None:
        if handle is not None:
            select.select([handle], [], [])
        else:  # elsewhere: poll
            while psutil.pid_exists(pid):
                time.sleep(2)
        os._exit(0)

    threading.Thread(target=wait, name=f"exit-with-{pid}", daemon=True).start()


def init_worker(rank_pid: int, worker_id: int) -> None:
    """``worker_init_fn``: seed the worker (:func:`seed_worker`), end it with its rank (:func:`exit_with`),
    and let the signals that stop a run pass it by (stopping.py): its rank stops it."""
    signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    seed_worker(worker_id)
    exit_with(rank_pid)


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
        with handoff.collecting() as pool:  # in a worker: its batch goes out in a block it reuses
            batch = self.collate(good) if good else {"key": []}
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


class Loader(StatefulDataLoader):
    """torchdata's StatefulDataLoader, whose workers get back the shared memory of the batches this
    process is done with (handoff.py: NOTE [ A worker's batches reuse their shared memory ])."""

    def __iter__(self) -> Iterator[dict]:
        return _received(super().__iter__())  # the workers start here, not at the first batch (signal masks)


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


def worker_context(method: str = "auto"):
    """The multiprocessing context DataLoader workers start from (``loader.start_method``).

    ``auto`` is a forkserver where the system has one (Linux, macOS), else spawn (Windows).

    # NOTE [ Workers start from a forkserver ]
    # A worker forked from the training process copies every lock that process holds at that
    # moment, and that process runs threads (gloo's, tqdm's monitor, the queue feeders of
    # persistent workers): a lock held by one of them is copied locked, and the new worker hangs
    # before it runs a line, with its rank waiting on it forever and the other ranks waiting in
    # a collective. A forkserver is a separate, single-threaded process started on first use;
    # each worker is forked from it, and gets the dataset by pickling (so a source holds only
    # what pickles cheaply: paths, NumPy arrays, no open handle). Importing the data stack in
    # the forkserver once keeps worker start-up fast. The forkserver is a fresh interpreter: it
    # finds this package as a plain `python` would (installed, or on PYTHONPATH), so the folder
    # holding the package goes on PYTHONPATH for it (a source tree that pytest's `pythonpath`
    # makes importable is not visible there); otherwise each worker would import torch itself.
    # spawn starts each worker as a fresh interpreter: as safe, slower to start. fork is never used.
    """
    if method == "auto":
        method = "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"
    root = str(Path(__file__).resolve().parents[2])
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if root not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([root, *paths])
    ctx = multiprocessing.get_context(method)
    _end_workers_at_exit()
    # NOTE [ Workers start with the stop signals blocked ]
    # A signal sent to a rank's whole process group (torchrun's, Slurm's, Ctrl-C's) stops the
    # rank alone, which then stops its workers (stopping.py): every process started for them
    # inherits the signals blocked. Blocked, not ignored: none is lost. multiprocessing's resource
    # tracker starts first, on its own: starting it *unblocks* SIGINT and SIGTERM in the caller
    # (CPython's resource_tracker.ensure_running), and started on the way to the first worker it
    # would leave that worker, or the forkserver, to die of the signal (the rank then waits for
    # batches that never come, or fails with `EOFError: unexpected EOF`).
    with stop_signals_blocked():
        multiprocessing.resource_tracker.ensure_running()
    if method == "forkserver":
        ctx.set_forkserver_preload([__name__])  # takes effect when the server starts
        with stop_signals_blocked():  # the forkserver, and so every worker it forks, inherits the mask
            multiprocessing.forkserver.ensure_running()
    return ctx


@contextmanager
def stop_signals_blocked():
    """Block the signals that stop a run (stopping.py) in this thread for the ``with`` block: a
    process started in it inherits the mask. One that arrives meanwhile waits, it is not lost."""
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)


@functools.cache
def _end_workers_at_exit() -> None:
    """At exit, kill the workers still running, before multiprocessing stops them with SIGTERM.

    multiprocessing's exit handler sends its daemonic children SIGTERM and waits for them; the
    workers block it (see worker_context), so a worker that a failed run left behind (an error
    raised while its loader was open) would make the process wait forever after its ``error:``
    line. This runs first (a finalizer of high priority) and kills them.
    """

    def kill() -> None:
        for worker in worker_processes():
            try:
                worker.kill()
            except psutil.Error:  # it ended meanwhile
                continue

    multiprocessing.util.Finalize(None, kill, exitpriority=100)


def worker_processes() -> list[psutil.Process]:
    """This process's DataLoader workers: the children of its forkserver, or its spawned children."""
    workers = []
    for child in psutil.Process().children():
        try:
            cmdline = " ".join(child.cmdline())
            if "forkserver" in cmdline:
                workers += child.children()
            elif "spawn_main" in cmdline:
                workers.append(child)
        except psutil.Error:  # it ended meanwhile
            continue
    return workers


def build_loader(
    dataset, cfg, split: str, *, rank: int | None = None, world_size: int | None = None, collate_fn=None
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
            worker_init_fn=functools.partial(init_worker, os.getpid()),
            generator=torch.Generator().manual_seed(cfg.train.seed + 1000 * rank),
            prefetch_factor=s.prefetch_factor if workers else None,
            # Validation workers start for each evaluation and end after it: kept, they would sit
            # idle through every training epoch, each a process holding its own memory.
            persistent_workers=s.persistent_workers if workers and train else False,
            multiprocessing_context=worker_context(cfg.loader.start_method) if workers else None,
            timeout=cfg.loader.timeout_s if workers else 0,
        )


def batches(loader, split: str) -> Iterator[dict]:
    """``loader``'s batches; workers that send none for ``loader.timeout_s`` become :class:`Stalled` naming it.

    # NOTE [ A stuck worker is an error, not a hang ]
    # A worker blocked for good (a hung network file system or server, a deadlock) would
    # otherwise keep its rank waiting forever, and the other ranks in their next collective.

    A mistake or an outage a worker found (a :class:`UserError`, a :class:`Stalled`) comes out as
    it was raised there: torch re-raises it with the worker's traceback in its message.
    """
    try:
        with stop_signals_blocked():  # spawned workers inherit the mask (see worker_context)
            iterator = iter(loader)
        yield from iterator
    except (UserError, Stalled) as e:
        said = said_in_worker(e)
        if said is None:
            raise
        raise type(e)(said) from None
    except RuntimeError as e:
        if "DataLoader timed out" not in str(e):
            raise
        raise Stalled(
            f"the {split} loader's workers sent no batch in {loader.timeout} s (loader.timeout_s): one is stuck "
            "(a hung file system or server, a deadlock; `py-spy dump --pid <worker pid>` shows where), or the data "
            "is slower than that: raise loader.timeout_s"
        ) from None


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
