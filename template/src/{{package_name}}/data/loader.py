# torchfeed's file: `copier update` replaces it. Your model is model.py; your augmentations, loss and
# metric are task.py; your settings configs/default.yaml (README.md: "Which files are yours").
"""The DataLoader factory: sampler, workers and seeding, over a plain ``StatefulDataLoader``.

    settings = loader_settings(cfg, {"train": train_set, "val": val_set}, saved)  # data/settings.py
    loader = build_loader(train_set, cfg, "train", settings["train"])
    for epoch in range(cfg.train.epochs):
        set_epoch(loader, epoch)  # a new order each epoch, on every rank
        for batch in loader: ...

The loader is torchdata's ``StatefulDataLoader``, through its public API: ``state_dict()`` between
batches is the position in the epoch, and ``load_state_dict(state)`` continues from it. Its workers
start from a forkserver (or by spawn, never by fork), seeded, with the signals that stop a run
blocked, and end with their training process. A worker that dies is one line built from its exit
code; a mistake a worker found comes out as it was raised; /dev/shm found full is one line (too small
for the settings is one line before any worker starts: data/settings.py).
"""

from __future__ import annotations

import contextlib
import functools
import glob
import importlib.util
import logging
import math
import multiprocessing
import multiprocessing.forkserver
import multiprocessing.resource_tracker
import multiprocessing.util
import os
import select
import signal
import threading
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import psutil
import torch
from torch.utils.data import IterableDataset, Sampler, default_collate
from torchdata.stateful_dataloader import StatefulDataLoader
from torchdata.stateful_dataloader.sampler import StatefulDistributedSampler

from .. import dist, project
from ..errors import SharedMemoryFull, Stalled, UserError, WorkerLost, died, unpicklable
from ..stopping import STOP_SIGNALS
from . import project_source
from .settings import FIXES, MARGIN, SHM, loader_settings, mb, shm_space
from .source import SkipBadCollate, Source, generators_kept

log = logging.getLogger(__name__)


class EvalSampler(Sampler[int]):
    """Rank ``r`` of ``w`` gets indices ``r, r + w, r + 2w, ...``: every sample exactly once.

    Unlike :class:`DistributedSampler` it never pads with duplicates, so metrics summed over
    ranks count each validation sample once; evaluation runs no collective per batch.

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
        return len(range(self.rank, self.length, self.num_replicas))


def build_loader(dataset, cfg, split: str, settings=None, *, rank=None, world_size=None, collate_fn=None) -> Loader:
    """The loader of ``split``, with arguments that mean what DataLoader's mean.

    Args:
        dataset: a source from ``build_dataset`` (or any Dataset of sample dicts).
        cfg (Config): ``loader.batch_size``, ``loader.drop_last``, ``loader.timeout_s``,
            ``loader.start_method`` and ``train.seed``.
        split (str): ``"train"`` shuffles, drops the last partial batch (``loader.drop_last``)
            and gives every rank the same number of batches; ``"val"`` reads every sample
            exactly once over all ranks, in order.
        settings (LoaderSettings, optional): ``loader_settings``'s for this loader (data/settings.py);
            default: resolved for this loader alone.
        rank, world_size (int, optional): for a map-style dataset, the share its sampler
            reads; default: the source's own, else the running process group's.
        collate_fn (callable, optional): default: the source's ``task.collate``, skipping bad
            samples (:class:`~.source.SkipBadCollate`); torch's ``default_collate`` for other datasets.
    """
    if settings is None:
        settings = loader_settings(cfg, {split: dataset})[split]
    loader_class = Loader
    if isinstance(dataset, Source):
        if rank is None or world_size is None:
            rank, world_size = dataset.rank, dataset.world_size
        elif isinstance(dataset, IterableDataset) and (rank, world_size) != (dataset.rank, dataset.world_size):
            raise ValueError(
                f"the source was opened for rank {dataset.rank} of {dataset.world_size}, not {rank} of {world_size}: "
                f"build_dataset(cfg, split, rank={rank}, world_size={world_size})"
            )
        collate_fn = collate_fn or SkipBadCollate(dataset.task.collate)
        loader_class = dataset.loader_class(split) or Loader
    elif rank is None or world_size is None:
        rank, world_size = dist.get_rank(), dist.get_world_size()
    train, workers, batch_size = split == "train", settings.num_workers > 0, cfg.loader.batch_size
    sampler = None
    if isinstance(dataset, IterableDataset):
        if train and isinstance(dataset, Source):
            dataset.check_workers(settings.num_workers)
            if dataset.planned_batches(batch_size, settings.num_workers, cfg.loader.drop_last) == 0:
                raise no_batch_left(batch_size, world_size, settings.num_workers)
    elif train:
        own = dataset.train_sampler(rank, world_size) if isinstance(dataset, Source) else None
        if (sampler := own) is None:
            sampler = StatefulDistributedSampler(dataset, num_replicas=world_size, rank=rank, seed=cfg.train.seed)
        if (len(sampler) // batch_size if cfg.loader.drop_last else len(sampler)) == 0:
            raise UserError(
                f"the train split has {len(dataset)} samples: with loader.batch_size={batch_size} x "
                f"world size {world_size} and loader.drop_last=true no batch is left (lower the batch size or add data)"
            )
    else:
        sampler = EvalSampler(len(dataset), rank=rank, num_replicas=world_size)
    collate_fn = collate_fn or default_collate
    if settings.pool_blocks and workers:
        from . import batch_pool  # beyond torch's public API: on where bench measured it faster

        collate_fn = batch_pool.pooled(collate_fn, settings.pool_blocks)
    options = loader_class.options(collate_fn, batch_size, cfg.loader.drop_last if train else False)
    with warnings.catch_warnings():  # torchdata calls torch.set_vital, which torch deprecates: not the user's concern
        warnings.filterwarnings("ignore", message="'set_vital' is deprecated", category=UserWarning)
        return loader_class(
            dataset,
            batch_size=batch_size,
            sampler=sampler,
            num_workers=settings.num_workers,
            pin_memory=settings.pin_memory,
            worker_init_fn=functools.partial(init_worker, os.getpid()),
            generator=torch.Generator().manual_seed(cfg.train.seed + 1000 * rank),
            prefetch_factor=settings.prefetch_factor if workers else None,
            persistent_workers=settings.persistent_workers and workers,
            multiprocessing_context=worker_context(cfg.loader.start_method) if workers else None,
            split=split,
            timeout_s=cfg.loader.timeout_s,
            **options,
        )


def no_batch_left(batch_size: int, world_size: int, num_workers: int) -> UserError:
    """The mistake of an iterable train split too small for one batch: found by :func:`build_loader` where the
    source counts its batches, by the first epoch (bench) where it cannot."""
    over = f", split over its {num_workers} workers," if num_workers > 1 else ""
    return UserError(
        f"each rank's share of the train split (world size {world_size}){over} is smaller than "
        f"loader.batch_size={batch_size}: no batch is left (lower it or loader.num_workers, set "
        "loader.drop_last=false, or add data)"
    )


def set_epoch(loader, epoch: int) -> None:
    """Tell the sampler, or a source that orders itself, which epoch starts."""
    if isinstance(loader.sampler, StatefulDistributedSampler):
        loader.sampler.set_epoch(epoch)
    if isinstance(loader.dataset, Source):
        loader.dataset.set_epoch(epoch)


class Loader(StatefulDataLoader):
    """torchdata's StatefulDataLoader, its workers started with the stop signals blocked, its errors said
    in one line: a mistake a worker found, as it was raised there (SkipBadCollate's NOTE); a worker that
    died, from its exit code; workers that sent nothing for ``timeout_s``; a part that does not pickle;
    /dev/shm full.

    Args:
        split (str): what its messages call it (``"train"``, ``"val"``).
        timeout_s (float): seconds one batch may take before :class:`Stalled` (0: no limit); the rest
            are StatefulDataLoader's.
    """

    def __init__(self, *args, split: str = "train", timeout_s: float = 0, **kwargs) -> None:
        self.split, self.timeout_s = split, timeout_s
        self.workers: list[multiprocessing.Process] = []  # the worker processes of the running iterator
        super().__init__(*args, **kwargs)

    @classmethod
    def options(cls, collate_fn, batch_size: int, drop_last: bool) -> dict:
        """The DataLoader arguments this kind of loader batches with (a source's own kind may join batches)."""
        return {"collate_fn": collate_fn, "drop_last": drop_last}

    def planned_batches(self) -> int | None:
        """Batches every rank gets this epoch (``None``: not known before it ends); after :func:`set_epoch`.

        A map-style dataset's sampler knows them; an iterable source may (:meth:`Source.planned_batches`).
        """
        if not isinstance(self.dataset, IterableDataset):
            return len(self)
        if isinstance(self.dataset, Source):
            return self.dataset.planned_batches(self.batch_size, self.num_workers, self.drop_last)
        return None

    def __iter__(self):
        before = set(multiprocessing.active_children())
        try:
            with stop_signals_blocked():  # the workers start here, and inherit the mask
                batches = super().__iter__()
        except Exception as e:
            raise self.explained(e) from None
        self.workers = [p for p in multiprocessing.active_children() if p not in before] or self.workers
        return self._checked(batches)

    def _checked(self, batches):
        try:
            while True:
                try:
                    # in the training process (num_workers=0) its generators are kept once a batch, not once a
                    # sample (source.generators_kept), a map-style or an iterable source's alike
                    with _watched(self.timeout_s, self.lost) if self.num_workers else generators_kept():
                        batch = next(batches)
                except StopIteration:
                    return
                except _TimedOut:
                    raise Stalled(
                        f"the {self.split} loader's workers sent no batch in {self.timeout_s} s (loader.timeout_s): "
                        "one is stuck (a hung file system or server, a deadlock; `py-spy dump --pid <worker pid>` "
                        "shows where), or the data is slower than that: raise loader.timeout_s"
                    ) from None
                except Exception as e:
                    raise self.explained(e) from None
                if "error" in batch:  # a mistake or an outage a worker found (SkipBadCollate)
                    # popped, not read: the error's traceback holds this frame, whose batch would hold the
                    # error, a cycle that keeps the workers until the garbage collector runs (and then
                    # torch's shutdown of them waits 5 s)
                    raise batch.pop("error")
                yield batch
        finally:  # the epoch's workers end with it, unless they persist: their exit is no loss
            if not self.persistent_workers:
                self.workers = []

    def explained(self, e: Exception) -> Exception:
        """What ``e``, raised while this loader waited for its workers, means: a worker that ended (its
        exit code), /dev/shm full, a part that does not pickle; else ``e`` itself."""
        if (dead := self.lost()) is not None:
            return dead
        space = shm_space()
        if self.workers and space is not None and space[1] < MARGIN:  # a worker found no room for its batch
            for worker in self.workers:  # the file torch failed to fill stays behind
                for name in glob.glob(os.path.join(SHM, f"torch_{worker.pid}_*")):
                    with contextlib.suppress(OSError):
                        os.unlink(name)
            return SharedMemoryFull(
                f"the {self.split} loader's workers found no room for their batches in /dev/shm ({mb(space[0])}): "
                f"something else fills it (`df -h {SHM}`), or batches are larger than the first ones; {FIXES}"
            )
        if self.num_workers and self.multiprocessing_context is not None:
            parts = {"dataset": self.dataset, "collate_fn": self.collate_fn}
            return unpicklable(parts, self.split, self.multiprocessing_context.get_start_method()) or e
        return e

    def lost(self, wait_s: float = 5.0) -> WorkerLost | None:
        """A :class:`WorkerLost` naming a worker of this loader that ended (``None``: all run), waiting up to
        ``wait_s`` for one being killed to be seen ended (a broken hand-over comes first, as a
        ConnectionResetError or EOFError)."""
        deadline = time.monotonic() + wait_s
        while self.workers:
            dead = [p for p in self.workers if p.exitcode]  # ended by a signal, or an error
            if dead:
                return WorkerLost(died(self.split, dead[0].pid, dead[0].exitcode))
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.05)
        return None


class _TimedOut(Exception):
    pass


CHECK_S = 1.0  # how often a loader waiting for a batch looks at its workers' exit codes


@contextlib.contextmanager
def _watched(seconds: float, lost: Callable[..., WorkerLost | None]):
    """Raise :class:`_TimedOut` in the block once ``seconds`` have passed (0: never), and the
    :class:`WorkerLost` that ``lost(0)`` names as soon as it names one, looking every ``CHECK_S``.

    torch notices a worker that ended between its reads of the workers' pipe, and by SIGCHLD, which
    workers started by the forkserver do not send this process: one killed halfway through writing a
    batch (the OOM killer picks the busiest) leaves torch reading the rest, which never comes. The main
    thread only: an alarm, whose handler interrupts that read (and torch's wait for a batch).
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    end = time.monotonic() + seconds if seconds else math.inf

    def check(signum, frame) -> None:
        if (dead := lost(0)) is not None:
            raise dead
        if time.monotonic() >= end:
            raise _TimedOut

    previous = signal.signal(signal.SIGALRM, check)
    signal.setitimer(signal.ITIMER_REAL, CHECK_S, CHECK_S)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


# --- workers -----------------------------------------------------------------------------------
METHODS = ("forkserver", "spawn")
# What the forkserver imports once, so that a worker forked from it imports none of the project's modules
# to unpickle its source (tests/test_sources.py). Each import it missed, each worker paid: OmegaConf's took
# 0.15 s here. Your task.py, model.py (the config reads ModelConfig) and sources.py are imported there too.
PRELOAD = [
    f"{__package__}.loader",  # the data stack
    importlib.util.resolve_name(project_source.CLASS.partition(":")[0], project.PACKAGE),  # the project's source
    f"{project.PACKAGE}.config",  # the cfg a source holds
    "multiprocessing.sharedctypes",  # a source's epoch, in shared memory (data/source.py)
]


def start_method(method: str = "auto") -> str:
    """``loader.start_method`` resolved: ``auto`` is ``$<PACKAGE>_START_METHOD`` when set (``spawn``: how
    Windows starts workers), else a forkserver where the system has one, else spawn."""
    variable = f"{project.PACKAGE.upper()}_START_METHOD"
    if method == "auto":
        method = os.environ.get(variable) or "auto"
        if method not in ("auto", *METHODS):
            raise UserError(f"{variable}={method!r} is no start method (expected one of: {', '.join(METHODS)})")
    if method == "auto":
        method = "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"
    return method


def worker_context(method: str = "auto"):
    """The multiprocessing context workers start from (DataLoader's ``multiprocessing_context``).

    # NOTE [ Workers start from a forkserver, with the stop signals blocked ]
    # A worker forked from the training process copies every lock that process holds at that
    # moment, and it runs threads (gloo's, tqdm's, the pin-memory thread): a lock held by one of
    # them is copied locked, and the worker hangs before its first line. A forkserver is a
    # single-threaded process that imports the data stack once (PRELOAD: your task.py and model.py
    # too, so they start no thread and touch no GPU as they are imported); each worker is forked from
    # it and gets its dataset by pickling (so a source holds paths and arrays, no open handle). It finds
    # this package as a plain `python` would, so the folder holding it goes on PYTHONPATH. spawn
    # starts a fresh interpreter per worker: as safe, slower to start. fork is never used.
    # A signal sent to a rank's process group (torchrun's, Slurm's, Ctrl-C) stops the rank alone,
    # which ends its workers after its checkpoint (stopping.py): the forkserver and spawned workers
    # inherit the stop signals blocked (not ignored: none is lost). multiprocessing's resource
    # tracker starts first, as starting it unblocks SIGINT and SIGTERM in its caller.
    """
    method = start_method(method)
    root = str(Path(__file__).resolve().parents[2])
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if root not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([root, *paths])
    ctx = multiprocessing.get_context(method)
    _kill_workers_at_exit()
    with stop_signals_blocked():
        multiprocessing.resource_tracker.ensure_running()  # it unblocks SIGINT and SIGTERM here: blocked again next
    if method == "forkserver":
        ctx.set_forkserver_preload(PRELOAD)
        with stop_signals_blocked():
            multiprocessing.forkserver.ensure_running()
    return ctx


@contextlib.contextmanager
def stop_signals_blocked():
    """Block the signals that stop a run (stopping.py) in this thread for the block: a process started in it
    inherits the mask; a signal that arrives meanwhile waits, it is not lost."""
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)


def init_worker(rank_pid: int, worker_id: int) -> None:
    """``worker_init_fn``: keep the stop signals blocked, end with the rank.

    # NOTE [ Different augmentation in every worker; workers end with their rank ]
    # The loader's ``generator`` is seeded with seed + 1000 x rank and draws a base seed each time
    # workers start; torchdata's worker seeds torch, NumPy and ``random`` from base seed + worker id,
    # so a third-party augmentation never repeats across workers (a source's training samples are
    # seeded each from its own key: data/source.py, Source's NOTE). A worker started from the
    # forkserver has the forkserver as its parent, which lives while any worker does: a rank killed
    # with kill -9 (or by the OOM killer) would leave them running, so each worker watches its rank.
    """
    signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        handle = os.pidfd_open(rank_pid)  # Linux: readable when the process ends
    except ProcessLookupError:
        os._exit(0)
    except (AttributeError, OSError):  # elsewhere: poll
        handle = None

    def wait() -> None:
        if handle is not None:
            select.select([handle], [], [])
        while handle is None and psutil.pid_exists(rank_pid):
            time.sleep(2)
        os._exit(0)

    threading.Thread(target=wait, name=f"exit-with-{rank_pid}", daemon=True).start()


@functools.cache
def _kill_workers_at_exit() -> None:
    """At exit, kill the workers still running: multiprocessing would send them SIGTERM, which they block,
    and wait for them forever (after an ``error:`` line, a loader may still be open)."""

    def kill() -> None:
        for child in multiprocessing.active_children():
            child.kill()

    multiprocessing.util.Finalize(None, kill, exitpriority=100)
