# torchfeed's file: `copier update` replaces it. Your model is model.py; your augmentations, loss and
# metric are task.py; your settings configs/default.yaml (README.md: "Which files are yours").
"""Pipeline checks run by `bench`: each classic data-loading bug, measured on the real loader.

Each check returns a :class:`Check` line for the report: OK, WARN or FAIL, the number behind
it, and for a problem its likely cause and fix in the words a user would search for.

    python -m <package> bench          # runs these after the sweep
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import itertools
import multiprocessing
import random
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import psutil
import torch
from torch.utils.data import IterableDataset, Subset, get_worker_info

from .data import build_loader, set_epoch
from .data.source import SkipBadCollate, Source, sample_rng, sample_seed

OK, WARN, FAIL = "OK", "WARN", "FAIL"


@dataclass
class Check:
    name: str
    status: str  # OK | WARN | FAIL
    value: str  # the number behind the verdict
    advice: str = ""  # cause and fix, for WARN and FAIL


def _variant(cfg, **loader):
    cfg = copy.deepcopy(cfg)
    cfg.loader.tuned = ""
    cfg.loader.drop_last = False
    for key, value in loader.items():
        setattr(cfg.loader, key, value)
    return cfg


def worker_processes() -> list[psutil.Process]:
    """This process's loader workers (the processes it started with multiprocessing)."""
    workers = []
    for child in multiprocessing.active_children():
        with contextlib.suppress(psutil.Error, ValueError):  # it ended meanwhile
            workers.append(psutil.Process(child.pid))
    return workers


def _fds(proc: psutil.Process) -> int:
    return sum(p.num_fds() for p in [proc, *proc.children(recursive=True)])


def check_open_files(cfg, dataset, batches: int = 40) -> Check:
    """File descriptors must not grow while batches are read (a handle leak in ``__getitem__``)."""
    loader = build_loader(dataset, _variant(cfg, num_workers=0), "train")
    proc = psutil.Process()
    it = iter(loader)
    next(it)  # the first batch may open what stays open on purpose (a connection per epoch)
    before = _fds(proc)
    read = 1 + sum(1 for _ in itertools.islice(it, batches))
    grown = _fds(proc) - before
    del it
    value = f"{max(grown, 0)} more open files after {read} batches"  # fewer: files the first batch opened, closed
    if grown > 2:
        return Check(
            "open files",
            FAIL,
            value,
            "Too many open files ahead: a file, connection or image is opened in "
            "__getitem__/__iter__ and never closed. Open it in a `with` block, or read the bytes and close "
            "(PIL: Image.open(...).load() or `with Image.open(...)`).",
        )
    return Check("open files", OK, value)


def check_epochs(cfg, dataset, num_workers: int) -> Check:
    """Epoch 2 must yield as many samples as epoch 1 (an IterableDataset reusing a consumed iterator)."""
    loader = build_loader(dataset, _variant(cfg, num_workers=num_workers, persistent_workers=True), "train")
    counts = []
    for epoch in range(2):
        set_epoch(loader, epoch)
        counts.append(sum(len(b["key"]) + len(b.get("bad", ())) for b in loader))
    value = f"epoch 1: {counts[0]} samples, epoch 2: {counts[1]}"
    if counts[1] < counts[0]:
        return Check(
            "second epoch",
            FAIL,
            value,
            "Epoch 2 yields less than epoch 1: the IterableDataset keeps one "
            "iterator (a generator or cursor made in __init__) that the first epoch used up. Create the "
            "iterator, cursor or file handle inside __iter__, fresh each time it is called.",
        )
    return Check("second epoch", OK, value)


def check_duplicates(cfg, open_rank: Callable, num_workers: int, world_size: int = 2) -> Check:
    """No key may be read twice in an epoch, over workers and (simulated) ranks.

    Args:
        open_rank: ``open_rank(rank, world_size)`` -> that rank's dataset (an iterable source
            reads only its rank's share; a map-style one is split by the loader's sampler).
    """
    cfg = _variant(cfg, num_workers=num_workers, persistent_workers=False)
    keys: list[str] = []
    iterable = False
    for rank in range(world_size):
        dataset = open_rank(rank, world_size)
        iterable = isinstance(dataset, IterableDataset)
        loader = build_loader(dataset, cfg, "train", rank=rank, world_size=world_size)
        set_epoch(loader, 0)
        keys += [k for batch in loader for k in batch["key"]]
    repeats = sum(n - 1 for n in Counter(keys).values() if n > 1)
    padding = 0 if iterable else (-len(dataset)) % world_size  # DistributedSampler pads to a multiple of the ranks
    value = f"{repeats} repeated keys in {len(keys)} samples ({world_size} ranks x {max(1, num_workers)} workers)"
    if repeats and repeats <= padding:
        value += (
            f": the training sampler's padding, which repeats {padding} sample(s) so that {len(dataset)} samples "
            f"split evenly over {world_size} ranks (validation never pads)"
        )
    if repeats > padding:
        return Check(
            "duplicates across workers/ranks",
            FAIL,
            value,
            "Every worker (or rank) reads the same data: "
            "split an IterableDataset by rank and then by worker (torch.utils.data.get_worker_info(), "
            "RANK/WORLD_SIZE), or use DistributedSampler for a map-style dataset.",
        )
    return Check("duplicates across workers/ranks", OK, value)


def check_worker_memory(cfg, dataset, num_workers: int, batches: int = 60) -> Check:
    """Worker memory must not keep growing through an epoch (copy-on-read, or a cache without a bound).

    Measured as anonymous memory, what a worker allocated itself (objects, copies, buffers):
    RSS, and even USS, would also count the file pages it maps (a cache read by every worker
    lives once in the page cache).
    """
    if num_workers == 0:
        return Check("worker memory growth", OK, "n/a (num_workers=0)")
    loader = build_loader(dataset, _variant(cfg, num_workers=num_workers, persistent_workers=True), "train")
    samples = []
    for epoch in range(100):
        set_epoch(loader, epoch)
        for batch in loader:
            del batch
            samples.append(max((anonymous_bytes(w) for w in worker_processes()), default=0))
            if len(samples) >= batches:
                break
        if len(samples) >= batches:
            break
    start = samples[min(len(samples) - 1, max(2, len(samples) // 4))]
    grown_mb = (samples[-1] - start) / 2**20
    value = f"{grown_mb:+.1f} MB per worker over {len(samples)} batches (peak {max(samples) / 2**20:.0f} MB)"
    advice = (
        "Worker memory keeps growing: a Python list/dict of file names read in every worker (copy-on-read: "
        "keep the index in NumPy arrays) or a cache without a bound in the Dataset (bound it, or drop it)."
    )
    if grown_mb > 64:
        return Check("worker memory growth", FAIL, value, advice)
    if grown_mb > 16:
        return Check("worker memory growth", WARN, value, advice)
    return Check("worker memory growth", OK, value)


def anonymous_bytes(process: psutil.Process) -> int:
    """Memory the process allocated itself, not the files it maps (Linux; elsewhere its USS)."""
    try:
        with open(f"/proc/{process.pid}/smaps_rollup", encoding="ascii") as f:
            for line in f:
                if line.startswith("Anonymous:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return process.memory_full_info().uss


def _digest(t: torch.Tensor | dict) -> str:
    """A digest of a sample: a tensor, or (the device path) its parts: the image, its crop box and flip."""
    if isinstance(t, dict):
        return "".join(_digest(v.reshape(-1)) for _, v in sorted(t.items()))
    return hashlib.sha1(t.contiguous().numpy().tobytes()).hexdigest()


def _sample_digests(batch: dict) -> list[str]:
    """A digest of each sample of a batch: its input and, when the device crops it, its box and flip."""
    parts = [batch[k] for k in ("box", "flip") if k in batch]
    return [_digest(x) + "".join(_digest(p[i].reshape(-1)) for p in parts) for i, x in enumerate(batch["input"])]


def _rng_states() -> tuple:
    _, keys, position, has_gauss, gauss = np.random.get_state()
    return torch.get_rng_state(), (keys.copy(), position, has_gauss, gauss), random.getstate()


def draws_random_numbers(dataset, tries: int = 8) -> bool:
    """Whether producing a sample draws from torch's, NumPy's or Python's random generator.

    This is how the check knows that the train transform is meant to be random, whatever
    task.py defines: a transform that draws nothing is deterministic and has nothing to vary.
    A source's task is called directly (its own seeding, Source.transformed, restores torch's).
    """
    if isinstance(dataset, Source):
        items = (_try(dataset.task, p) for p in dataset.peek(tries))
    elif isinstance(dataset, IterableDataset):
        items = iter(dataset)
    else:
        items = (dataset[i] for i in range(len(dataset)))
    for _ in range(tries):
        before = _rng_states()
        item = next(items, None)
        if item is None:
            return False
        if "bad" not in item:
            after = _rng_states()
            numpy_same = np.array_equal(before[1][0], after[1][0]) and before[1][1:] == after[1][1:]
            same = torch.equal(before[0], after[0]) and numpy_same and before[2] == after[2]
            return not same
    return False


class _Repeat(IterableDataset):
    """``copies`` augmented copies of one sample, dealt over the loader's workers."""

    def __init__(self, task, payload: bytes, copies: int) -> None:
        self.task, self.payload, self.copies = task, payload, copies

    def __iter__(self):
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        for i in range(worker, self.copies, workers):
            yield {"input": self.task(self.payload), "target": 0, "key": f"copy-{i}"}


def _try(task, payload: bytes) -> dict:
    try:
        return {"input": task(payload)}
    except Exception as e:
        return {"bad": str(e)}


def _good_payloads(source: Source, n: int = 16) -> list[bytes]:
    return [p for p in source.peek(n) if "bad" not in _try(source.task, p)]


def _copies(cfg, dataset, num_workers: int, copies: int = 32):
    """A loader of ``copies`` of one readable sample: through ``__getitem__``, or a source's task.

    A source seeds each sample's augmentation from (seed, epoch, key) (Source.transformed), so
    the copies go through its task directly: what varies them is the workers' own seeding.
    """
    variant = _variant(cfg, num_workers=num_workers, batch_size=4)
    if isinstance(dataset, Source):
        collate = SkipBadCollate(dataset.task.collate)
        return build_loader(
            _Repeat(dataset.task, _good_payloads(dataset)[0], copies), variant, "train", collate_fn=collate
        )
    first_good = next(i for i in range(len(dataset)) if "bad" not in dataset[i])
    repeated = Subset(dataset, [first_good] * copies)
    return build_loader(repeated, variant, "train", rank=0, world_size=1)


def _same_over_epochs(source: Source, epochs: int = 2) -> tuple[int, int]:
    """A source's samples augmented as its loader does it, in two epochs: (the same in both, compared)."""
    same = total = 0
    for i, payload in enumerate(_good_payloads(source, 8)):
        digests = set()
        for epoch in range(epochs):
            with sample_rng(sample_seed(source.seed, epoch, f"check/{i}")):
                digests.add(_digest(source.task(payload)))
        same, total = same + (len(digests) == 1), total + 1
    return same, total


def check_augmentation(cfg, dataset, num_workers: int) -> Check:
    """Augmentations must differ between epochs and between workers (seeding)."""
    if not draws_random_numbers(dataset):
        return Check("augmentation randomness", OK, "n/a (the train transform draws no random numbers)")
    if isinstance(dataset, IterableDataset) and not isinstance(dataset, Source):
        loader = build_loader(dataset, _variant(cfg, num_workers=num_workers), "train")
        seen = []  # the same key in two epochs must come out different
        for epoch in range(2):
            set_epoch(loader, epoch)
            seen.append({k: d for b in itertools.islice(loader, 8) for k, d in zip(b["key"], _sample_digests(b))})
        common = seen[0].keys() & seen[1].keys()
        same, total = sum(seen[0][k] == seen[1][k] for k in common), len(common)
    else:  # one sample, many times, through several workers and two epochs: every copy must differ
        loader = _copies(cfg, dataset, max(2, num_workers))
        digests = []
        for epoch in range(2):
            set_epoch(loader, epoch)
            digests += [d for b in loader for d in _sample_digests(b)]
        total, same = len(digests), len(digests) - len(set(digests))
        if isinstance(dataset, Source):  # and the source's own seeding: new numbers each epoch
            same, total = (a + b for a, b in zip((same, total), _same_over_epochs(dataset)))
    value = f"{same} identical of {total} augmented copies"
    if same and same <= total // 8:
        value += (
            f": within the {total // 8} that chance allows (two crops of a small image can coincide); more would "
            "mean generators seeded alike"
        )
    if total and same > total // 8:
        return Check(
            "augmentation randomness",
            FAIL,
            value,
            "Augmentations repeat across workers or epochs: a "
            "fixed seed inside __getitem__, or NumPy/random seeded the same in every worker. Seed per "
            "worker from torch.initial_seed() in worker_init_fn, never with a constant.",
        )
    return Check("augmentation randomness", OK, value)


def check_collate(cfg, dataset) -> Check:
    """The collate function must batch real samples (variable-length samples need padding)."""
    loader = build_loader(dataset, _variant(cfg, num_workers=0), "train")
    try:
        batch = next(b for b in loader if len(b["key"]))
    except RuntimeError as e:
        return Check(
            "collate",
            FAIL,
            f"{type(e).__name__}: {str(e)[:120]}",
            "The samples cannot be stacked into "
            "one tensor (variable lengths?): pass a collate_fn that pads to the longest sample and returns "
            "a mask.",
        )
    x = batch["input"]
    shown = f"{tuple(x.shape)} {x.dtype}" if torch.is_tensor(x) else f"{len(x)} samples to finish on the device"
    return Check("collate", OK, f"batch input {shown}")


def run_checks(cfg, dataset, num_workers: int) -> list[Check]:
    """All checks on ``dataset`` with the chosen ``num_workers``; a few seconds on the sample data."""
    start = time.perf_counter()
    if cfg.data.mix:  # each entry read once an epoch: a sample read twice is then a fault, not a cycle
        from .data.mix import read_once

        cfg = read_once(cfg)
        dataset = type(dataset).open(cfg, dataset.split, dataset.task)
    checks = [check_collate(cfg, dataset)]
    if checks[0].status == FAIL:  # nothing else can batch either
        return checks

    def open_rank(rank: int, world_size: int):
        if isinstance(dataset, Source):
            return type(dataset).open(cfg, dataset.split, rank=rank, world_size=world_size)
        return dataset

    checks += [
        check_open_files(cfg, dataset),
        check_epochs(cfg, dataset, num_workers),
        check_duplicates(cfg, open_rank, num_workers),
        check_worker_memory(cfg, dataset, num_workers),
        check_augmentation(cfg, dataset, num_workers),
    ]
    checks.append(Check("checks took", OK, f"{time.perf_counter() - start:.1f} s"))
    return checks
