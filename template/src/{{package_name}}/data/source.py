# torchfeed's file: `copier update` replaces it. Your model is model.py; your augmentations, loss and
# metric are task.py; your settings configs/default.yaml (README.md: "Which files are yours").
"""The source interface: what every data source gives the loader factory, ``train`` and ``bench``.

A source reads one split of the data, for one rank, and turns each sample's bytes into a
sample dict with the task (``task.py``)::

    {"input": tensor, "target": int, "key": str}   # a good sample
    {"key": str, "bad": "Reason: ..."}             # one that could not be read or decoded

``data.source`` names the source a run reads: this project's own (data/project_source.py) or
one of yours. To read another kind of data, write a subclass of :class:`Source` in a module of
yours, and name it in sources.py (its keys go there too, in ``SourceKeys``).

What a source must do: its constructor, :meth:`Source.peek` and :meth:`Source.fingerprint`, and
map-style ``__len__``/``__getitem__`` (the loader's sampler splits the data by rank), or an
``IterableDataset``'s ``__iter__`` that splits it by rank, then by worker. Optional, each enabling
one thing:

- :meth:`Source.write_samples` (the sample-data protocol): ``sample-data`` writes sample data
  for it, and the project's contract tests (tests/test_sources.py) run on it;
- :meth:`Source.identity` and :meth:`Source.records`: ``pack --to cache`` can cache it (without
  them, ``pack`` says so in one line, and the tests skip the cache).
"""

from __future__ import annotations

import abc
import contextlib
import contextvars
import dataclasses
import hashlib
import logging
import multiprocessing
import random
import re
import sysconfig
import traceback
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch
from torch.utils.data import get_worker_info

from .. import dist
from ..errors import Stalled, UserError
from ..task import Task

log = logging.getLogger(__name__)


class Sample(NamedTuple):
    """One sample as ``sample-data`` and the tests hand it to :meth:`Source.write_samples`."""

    split: str  # "train" or "val"
    label: int  # the class id, 0 .. classes - 1
    label_name: str  # the class's name (e.g. what a folder of class sub-folders calls it)
    name: str  # a name unique within its split and class, without extension
    ext: str  # the file extension of ``data``, one of the task's ``extensions``
    data: bytes  # the encoded sample: the bytes of a file


class Source(abc.ABC):
    """The interface of a data source; build one with :meth:`open`.

    Args:
        cfg (DataConfig): the ``data`` section of the config.
        split (str): ``"train"`` or ``"val"``.
        task (Task): decodes and transforms one sample (this split's transforms).
        seed (int): seeds whatever order the source itself draws (``train.seed``).
        rank, world_size (int): which share of the data this process reads.

    A subclass sets ``classes`` (class names in label order) in its constructor, and turns a
    sample's bytes into its tensor with :meth:`transformed` (the seeded augmentation below).

    # NOTE [ A sample's augmentation depends on (seed, epoch, key) alone ]
    # A worker's random generators run on from sample to sample, so the crop a sample got would
    # depend on which worker read it and on everything that worker read before: a run resumed
    # mid-epoch, whose new workers start their generators afresh, would see other crops than the
    # run it continues. Instead the generators are seeded for each training sample from
    # (train.seed, epoch, key) just before its transform runs: the same sample in the same epoch
    # gets the same random numbers at any num_workers, prefetch_factor or persistent_workers,
    # resumed or not, and another epoch gets new ones. Torch's, NumPy's and Python's generators
    # are seeded (a third-party augmentation draws from any of them); in the training process
    # itself (num_workers=0) they are saved and restored around the sample, so the model's own
    # random numbers (dropout) run on undisturbed, and a checkpoint holds them.

    # NOTE [ set_epoch reaches persistent workers ]
    # Workers started once (persistent_workers=True) keep their copy of the source, so a plain
    # ``self.epoch = e`` in the training process would never reach them. The epoch lives in shared
    # memory (``multiprocessing.Value``), which a worker reads for each sample.
    """

    classes: list[str]

    def __init__(self, cfg, split: str, task: Task, *, seed: int = 0, rank: int = 0, world_size: int = 1) -> None:
        if split not in ("train", "val"):
            raise ValueError(f"split {split!r} is unknown (expected 'train' or 'val')")
        if not 0 <= rank < world_size:
            raise ValueError(f"Invalid rank {rank}, rank should be in the interval [0, {world_size - 1}]")
        self.cfg, self.split, self.task, self.seed = cfg, split, task, seed
        self.rank, self.world_size = rank, world_size
        self._epoch = multiprocessing.Value("q", 0, lock=False)

    @classmethod
    def open(
        cls, cfg, split: str, task: Task | None = None, *, rank: int | None = None, world_size: int | None = None
    ) -> Source:
        """The source of ``split`` for this process (or the given rank), its task prepared.

        Args:
            cfg (Config): the run's config.
            split (str): ``"train"`` or ``"val"``.
            task (Task, optional): decodes and transforms the samples; default ``Task(cfg.data, split)``.
            rank, world_size (int, optional): default to the running process group's; pass
                them to build another rank's share (tests, ``bench``'s checks).
        """
        if rank is None or world_size is None:
            rank, world_size = dist.get_rank(), dist.get_world_size()
        task = task if task is not None else Task(cfg.data, split)
        source = cls(cfg.data, split, task, seed=cfg.train.seed, rank=rank, world_size=world_size)
        source.task.prepare(source.peek(16), where=cfg.data.root, num_classes=source.num_classes)
        return source

    @classmethod
    def write_samples(cls, cfg, dest: str, samples: Iterable[Sample]) -> None:
        """The sample-data protocol: write ``samples`` at ``dest`` in the layout this source reads.

        ``data.root=dest`` then reads them (a source whose root is not a path, such as an API's
        URL, says where its samples are served from instead). ``sample-data`` writes with it, into
        a new or empty path; the tests (tests/test_sources.py) write their sample data with it and
        check the source on what they wrote. Optional: without it, ``sample-data`` says so in one
        line and those tests skip.

        Args:
            cfg (DataConfig): the ``data`` section.
            dest (str): where to write: a folder or a file, as ``data.root`` names one.
            samples (iterable of :class:`Sample`): the samples of both splits, in order.
        """
        raise UserError(
            f"{cls.__name__} defines no write_samples() (the sample-data protocol, data/source.py), which "
            "`sample-data` and the source's contract tests need"
        )

    @classmethod
    def writes_samples(cls) -> bool:
        """Whether this source implements the sample-data protocol (:meth:`write_samples`)."""
        return cls.write_samples.__func__ is not Source.write_samples.__func__

    @classmethod
    def cacheable(cls) -> bool:
        """Whether ``pack --to cache`` can cache this source: it defines :meth:`identity` and :meth:`records`."""
        return cls.identity is not Source.identity and cls.records is not Source.records

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    @property
    def epoch(self) -> int:
        return self._epoch.value

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        if multiprocessing.context.get_spawning_popen() is None:  # a copy, not a worker's: the epoch as it is
            state["_epoch"] = self._epoch.value
        return state

    def __setstate__(self, state: dict) -> None:
        if isinstance(state["_epoch"], int):
            state["_epoch"] = multiprocessing.Value("q", state["_epoch"], lock=False)
        self.__dict__.update(state)

    def transformed(self, key: str, transform: Callable, data):
        """``transform(data)`` for sample ``key``; in training, with random numbers from (seed, epoch, key)."""
        if self.split != "train":
            return transform(data)
        with sample_rng(sample_seed(self.seed, self.epoch, key)):
            return transform(data)

    def __getitems__(self, indices: list[int]) -> list[dict]:
        """A map-style source's batch of samples, as DataLoader fetches it (in a worker, or in the training process
        at num_workers=0): a mistake or an outage met there travels with the batch (:class:`SkipBadCollate`)."""
        try:
            return [self[i] for i in indices]
        except (UserError, Stalled) as e:
            return [{"key": "", "error": e}]

    def train_sampler(self, rank: int, world_size: int):
        """A map-style source's own training sampler (``None``: the loader's, a ``DistributedSampler``)."""
        return None

    def loader_class(self, split: str):
        """The kind of loader that batches this source (``None``: data/loader.py's ``Loader``)."""
        return None

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
        :meth:`records` is: only ``pack --to cache`` needs them (see :meth:`cacheable`).
        """
        raise UserError(not_cacheable(type(self)))

    def records(self, start=None) -> Iterator[tuple]:
        """Every sample of this process's share, undecoded, in a fixed order, from cursor ``start``.

        Yields ``(key, label, bytes or the Exception reading them, cursor)``; passing a row's
        cursor (a JSON value) as ``start`` continues after that row (``pack`` resumes so).
        """
        raise UserError(not_cacheable(type(self)))

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

    def set_epoch(self, epoch: int) -> None:
        """A new epoch starts: new augmentations (an iterable source also reorders itself; a map-style
        one's sampler does that). A subclass that overrides it calls this one."""
        self._epoch.value = epoch


def not_cacheable(cls: type) -> str:
    """What ``pack --to cache`` says of a source that cannot be cached."""
    missing = [m for m in ("identity", "records") if getattr(cls, m) is getattr(Source, m)]
    return (
        f"{cls.__name__} cannot be cached: it defines no {' and no '.join(f'{m}()' for m in missing)}, which "
        "`pack --to cache` needs (data/source.py); train from the source itself (data.cache=)"
    )


def data_settings(cfg) -> dict:
    """The ``data`` keys that name the data and how it is read: all but ``bad_sample_budget`` (how much of
    it may be bad changes neither). Tuned loader settings and a resumed epoch's position depend on these."""
    return {k: v for k, v in dataclasses.asdict(cfg.data).items() if k != "bad_sample_budget"}


def sample_seed(seed: int, epoch: int, key: str) -> int:
    """The seed of one sample's augmentation in one epoch: a 64-bit digest of (seed, epoch, key).

    >>> key = "train/cat/0001"
    >>> sample_seed(0, 1, key) == sample_seed(0, 1, key) != sample_seed(0, 2, key)
    True
    """
    text = f"{seed}\0{epoch}\0{key}".encode("utf-8", "surrogateescape")
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little")


@contextlib.contextmanager
def sample_rng(seed: int) -> Iterator[None]:
    """Seed torch's, NumPy's and Python's random generators for one sample (see the NOTE in :class:`Source`).

    In a loader worker they serve nothing else; in the training process they are restored after
    the sample (:func:`generators_kept`), so the model's own random numbers run on undisturbed.
    """
    if get_worker_info() is not None or _KEEPING.get():
        seed_generators(seed)
        yield
        return
    with generators_kept():
        seed_generators(seed)
        yield


_KEEPING = contextvars.ContextVar("generators_kept", default=False)  # inside a generators_kept block


@contextlib.contextmanager
def generators_kept() -> Iterator[None]:
    """Leave torch's, NumPy's and Python's random generators as they were before the block: the training
    process reads samples (num_workers=0, a stand-in batch, a batch's size) without moving them.

    Blocks nest: the outermost keeps and restores them, once (NumPy's state alone takes about 110 us to
    save and restore), and the samples read inside it are only seeded.
    """
    if _KEEPING.get():
        yield
        return
    states = torch.get_rng_state(), np.random.get_state(), random.getstate()
    was = _KEEPING.set(True)
    try:
        yield
    finally:
        _KEEPING.reset(was)
        torch.set_rng_state(states[0])
        np.random.set_state(states[1])
        random.setstate(states[2])


def seed_generators(seed: int) -> None:
    """Seed torch's, NumPy's and Python's generators (in a loader worker, for one sample): about 6 us."""
    torch.default_generator.manual_seed(seed)
    np.random.seed(seed % 2**32)
    random.seed(seed)


class SkipBadCollate:
    """Batch the good samples with ``collate`` and carry the bad ones' ``(key, reason)`` in ``batch["bad"]``.

    # NOTE [ Bad samples and mistakes travel with the batch ]
    # A worker process cannot stop the run or keep a count the main process sees, so a sample
    # that fails to read or decode becomes ``{"key", "bad"}`` and rides along with its batch;
    # the training loop counts them in one place (its BadSampleBudget). A batch whose samples
    # were all bad is ``{"key": [], "bad": [...]}``: it never reaches the model. A mistake or an
    # outage a source meets in a worker (``{"key", "error": UserError}``) travels the same way,
    # and the loader raises it as it was raised, without the traceback a worker's error gets.
    """

    def __init__(self, collate) -> None:
        self.collate = collate

    def __call__(self, samples: list[dict]) -> dict[str, Any]:
        errors = [s["error"] for s in samples if "error" in s]
        if errors:
            return {"error": errors[0], "key": [], "bad": []}
        good = [s for s in samples if "bad" not in s]
        try:
            batch = self.collate(good) if good else {"key": []}
        except Exception as e:  # a mistake in the collate (task.py's): one line naming where, not a worker's traceback
            return {"error": collate_error(e), "key": [], "bad": []}
        batch["bad"] = [(s["key"], s["bad"]) for s in samples if "bad" in s]
        return batch


def collate_error(e: Exception) -> UserError:
    """A collate's exception as one line, naming the innermost line of the project's code it passed (task.py's
    collate, say), not the library's below it."""
    frames = traceback.extract_tb(e.__traceback__)
    libraries = ("site-packages", "dist-packages", sysconfig.get_paths()["stdlib"])
    own = [f for f in frames if not any(part in f.filename for part in libraries)]
    at = own[-1] if own else frames[-1]
    error = UserError(f"the collate raised {bad_reason(e)} (at {Path(at.filename).name}:{at.lineno}, in {at.name})")
    error.__cause__ = e  # --debug's traceback, where it was raised in this process
    return error


class BadSampleBudgetExceeded(UserError, RuntimeError):
    """More distinct samples failed than ``data.bad_sample_budget`` allows."""


class BadSampleBudget:
    """Log each unreadable sample once and stop the run when there are too many (in the process that owns
    the run: bad samples reach it with their batch, see :class:`SkipBadCollate`).

    Args:
        budget (int): how many distinct bad samples are tolerated (``data.bad_sample_budget``).

    >>> b = BadSampleBudget(1)
    >>> b.update([("train/cat/0001", "truncated")])
    >>> b.count
    1
    """

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.bad: dict[str, str] = {}

    @property
    def count(self) -> int:
        return len(self.bad)

    def update(self, bad: list[tuple[str, str]]) -> None:
        for key, reason in bad:
            if key in self.bad:
                continue  # the same file fails again next epoch: counted once
            self.bad[key] = reason
            log.warning("skipped bad sample %s: %s", key, reason)
        if len(self.bad) > self.budget:
            listing = "\n".join(f"  {k}: {r}" for k, r in self.bad.items())
            raise BadSampleBudgetExceeded(
                f"{len(self.bad)} bad samples exceed data.bad_sample_budget={self.budget}; "
                f"fix or remove them, or raise the budget:\n{listing}"
            )

    def state_dict(self) -> dict[str, str]:
        """The bad samples seen so far (a checkpoint keeps them: a resumed run counts each once)."""
        return dict(self.bad)

    def load_state_dict(self, bad: dict[str, str]) -> None:
        self.bad = dict(bad)


def bad_reason(e: BaseException) -> str:
    r"""Why a sample could not be read, in one line: the error's type and first line, without the source
    paths of a library's build machine that some decoders put in their messages.

    >>> bad_reason(RuntimeError("Decode failed /__w/lib/src/decoder.cpp:171: bad Huffman code\nmore"))
    'RuntimeError: Decode failed: bad Huffman code'
    """
    first = (str(e).strip().splitlines() or [""])[0]
    first = re.sub(r"\s*\(?[\w.\\-]*[/\\][\w./\\-]+\.(?:cpp|cxx|cc|hpp|c|h)\b(?::\d+)?\)?", "", first)
    return f"{type(e).__name__}: {first.strip()}"[:300]
