# torchfeed's file: `copier update` replaces it. Your model is model.py; your augmentations, loss and
# metric are task.py; your settings configs/default.yaml (README.md: "Which files are yours").
"""How long training waited for its data, on each rank, and the warnings when that is too long.

    wait, wait_warnings = DataWait(), WaitWarnings()
    for batch in wait.timed(loader): ...          # wait.seconds: this rank's wait in the epoch
    metrics |= by_rank(waits, seconds)            # waits: every rank's, summed over the ranks
    wait_warnings.epoch(epoch, waits, seconds)    # once a run: a loader that does not keep up, a rank that lags

A loader that keeps up has the next batch ready when the loop asks for it: the wait is host time
spent in the loader's ``next()``, with no device sync.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Iterator

import numpy as np

from . import dist, project

log = logging.getLogger(__name__)
DATA_WAIT_WARN = 0.10  # warn (once a run) when training waits for data longer than this share of an epoch
DATA_WAIT_MIN_S = 2.0  # ... and longer than this in all (a tiny epoch's first batches say nothing)
RANK_WAIT_RATIO = 3.0  # warn (once a run) when a rank waits for data this many times the others' median, or more


class DataWait:
    """Seconds the loop waited for its next batch: host time spent in the loader's ``next()``.

    The epoch's first batch, which waits for the workers to start, is left out.
    """

    def __init__(self, seconds: float = 0.0) -> None:
        self.seconds = seconds  # what the epoch waited before a resume, if it was resumed
        self.batches = 0
        self.first, self.first_at = 0, 0.0  # the first batch's samples (all ranks') and when it came

    def timed(self, batches: Iterable[dict]) -> Iterator[dict]:
        it = iter(batches)
        while True:
            started = time.perf_counter()
            batch = next(it, None)
            if self.batches:
                self.seconds += time.perf_counter() - started
            elif batch is not None:
                self.first, self.first_at = len(batch["key"]) * dist.get_world_size(), time.perf_counter()
            if batch is None:
                return
            self.batches += 1
            yield batch


def own_carried_wait(partial: dict | None) -> float:
    """This rank's data wait in its epoch before a resume: its own where the checkpoint kept each
    rank's with as many ranks as now, else an equal share of the ranks' sum.

    >>> own_carried_wait({"wait_by_rank": [2.5], "wait_s": 2.5}), own_carried_wait({"wait_s": 3.0})
    (2.5, 3.0)
    """
    by_rank = (partial or {}).get("wait_by_rank")
    if by_rank and len(by_rank) == dist.get_world_size():
        return by_rank[dist.get_rank()]
    return (partial or {}).get("wait_s", 0.0) / dist.get_world_size()


def by_rank(waits: list[float], seconds: float) -> dict:
    """An epoch's metrics of the wait: the ranks' mean, its share of the epoch, each rank's, and which
    rank waited longest, with its share of the epoch's ``seconds``."""
    mean = sum(waits) / len(waits)
    rank = max(range(len(waits)), key=waits.__getitem__)
    return {
        "data_wait_s": round(mean, 3),  # training waited for the loader
        "data_wait_frac": round(mean / max(seconds, 1e-9), 3),
        "data_wait_s_by_rank": [round(w, 3) for w in waits],
        "slowest_rank": rank,
        "slowest_rank_wait_frac": round(waits[rank] / max(seconds, 1e-9), 3),
    }


def lagging_rank(waits: list[float]) -> tuple[int, float, float] | None:
    """``(rank, its wait, the other ranks' median)`` when one rank waited for data at least
    ``RANK_WAIT_RATIO`` times the others' median and ``DATA_WAIT_MIN_S`` longer; else ``None``.

    >>> lagging_rank([1.0, 9.0, 1.2, 0.8])
    (1, 9.0, 1.0)
    >>> lagging_rank([1.0, 2.5]) is None
    True
    """
    if len(waits) < 2:
        return None
    rank = max(range(len(waits)), key=waits.__getitem__)
    others = float(np.median([w for r, w in enumerate(waits) if r != rank]))
    if waits[rank] >= RANK_WAIT_RATIO * others and waits[rank] - others >= DATA_WAIT_MIN_S:
        return rank, waits[rank], others
    return None


class WaitWarnings:
    """The two warnings of a run's data wait, each said once a run, by rank 0."""

    def __init__(self) -> None:
        self.said_rank = self.said_slow = False

    def epoch(self, epoch: int, waits: list[float], seconds: float) -> None:
        if not dist.is_main_process():
            return
        lagging = lagging_rank(waits)
        if lagging and not self.said_rank:
            self.said_rank = True
            log.warning(
                "rank %d waited %.1f s for data in epoch %d, %.1fx the other ranks' median (%.1f s), and every "
                "rank steps at its pace: its loader is slower than theirs. Likely causes: less data to read in "
                "parallel there (fewer pieces of the data than it has workers), a slower disk or mount on its "
                "node, fewer CPUs for its workers, or other jobs on that node",
                lagging[0],
                lagging[1],
                epoch,
                lagging[1] / max(lagging[2], 1e-9),
                lagging[2],
            )
        mean = sum(waits) / len(waits)
        if mean / max(seconds, 1e-9) > DATA_WAIT_WARN and mean >= DATA_WAIT_MIN_S and not self.said_slow:
            self.said_slow = True
            log.warning(
                "training waited for data %.0f%% of epoch %d (%.1f s): the loader does not keep up. Run `python -m "
                "%s bench` here to re-tune loader.* (the settings may have been measured on another machine or "
                "under less load); if its stall stays high, decoding and augmentation need more CPUs than this "
                "machine gives each process",
                100 * mean / max(seconds, 1e-9),
                epoch,
                mean,
                project.PACKAGE,
            )
