# torchfeed's file: `copier update` replaces it. Your model is model.py; your augmentations, loss and
# metric are task.py; your settings configs/default.yaml (README.md: "Which files are yours").
"""Training: :func:`main` sets a run up; :func:`train_one_epoch` and :func:`evaluate` are its loops.

One process:    python -m <package> train train.epochs=5
N processes:    python -m <package> launch --nproc-per-node N -- train train.epochs=5
                (the same as torchrun --standalone --nproc-per-node N -m <package> train ...)

What a batch means (its move to the device, the loss, the metric) is the task's (task.py); the
model is build_model's (model.py). The loop reads nothing back from the device between log
intervals: losses and counts add up on the device and are read every ``train.log_every`` steps.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import itertools
import json
import logging
import random
import signal
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.nn.parallel import DistributedDataParallel as DDP
from tqdm import tqdm

from . import dist, project
from .checkpoint import CHECKPOINT, Progress, find_checkpoint, resume, run_dir_lock, save
from .compute import Compute, FiniteGuard, learning_rate, make_optimizer, set_learning_rate, setup_compute, train_step
from .data import build_dataset, build_loader, set_epoch
from .data.mix import entry_counts, entry_metrics
from .data.settings import loader_settings
from .data.source import BadSampleBudget, generators_kept
from .data_wait import DataWait, WaitWarnings, by_rank, own_carried_wait
from .errors import DataError, Outage, UserError, WorkerLost
from .loggers import Loggers, make_loggers
from .model import build_model
from .stopping import StopOnSignal, Stopped

log = logging.getLogger(__name__)
NO_LOGGERS = Loggers([])


def main(cfg) -> list[dict]:
    """Train for ``cfg.train.epochs``; returns the per-epoch metrics (as in ``metrics.jsonl``)."""
    device = dist.pick_device(project.NUM_GPUS)
    dist.setup(cfg.dist.backend, cfg.dist.timeout_s, device)
    lock = run_dir_lock(Path(cfg.train.run_dir)) if dist.is_main_process() else contextlib.nullcontext()
    try:  # rank 0 writes the run's files: it holds run_dir for the run's length
        with lock, dist.name_lost_ranks(), StopOnSignal() as stop:
            return fit(cfg, device, stop)
    finally:
        dist.teardown()


def fit(cfg, device: torch.device, stop: StopOnSignal | None = None) -> list[dict]:
    """Build the data, model and optimizer, resume if there is a checkpoint, and run the epochs.

    On a signal (``stop``, see stopping.py) every rank ends after the same step, with a checkpoint.
    """
    stop = stop or StopOnSignal()
    run_dir = Path(cfg.train.run_dir)
    if dist.is_main_process():
        run_dir.mkdir(parents=True, exist_ok=True)
    seed_everything(cfg.train.seed + 1000 * dist.get_rank())
    # The train split's task (task.py) is the objective the loop trains (its loss and metric) and what
    # reads the training samples (its transforms); validation reads with its own, its eval transforms.
    train_set, val_set = build_dataset(cfg, "train"), build_dataset(cfg, "val")
    task = train_set.task
    saved = find_checkpoint(cfg, run_dir)
    ensure_tuned(cfg, train_set)
    # Every loader setting, resolved once (data/settings.py): the config, a mid-epoch checkpoint's
    # worker count, configs/tuned.yaml; both loaders' use of /dev/shm is checked together.
    settings = loader_settings(cfg, {"train": train_set, "val": val_set}, saved)
    train_loader = build_loader(train_set, cfg, "train", settings["train"])
    if cfg.data.mix and dist.is_main_process():  # the merged classes, and each entry's ids among them
        text = json.dumps(train_set.class_map(), indent=2, ensure_ascii=False)
        (run_dir / "classes.json").write_text(text + "\n", encoding="utf-8")
    val_loader = build_loader(val_set, cfg, "val", settings["val"])

    model = build_model(cfg, train_set.num_classes, task.sample_shape).to(device)
    compute = setup_compute(cfg.train.amp, device, model)
    log.info("training on %s in %s%s", device, compute.precision, " (channels_last)" if compute.channels_last else "")
    ddp_model = model
    if dist.is_distributed():
        ddp_model = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    optimizer = make_optimizer(model, cfg.optim, device)

    progress, budget = Progress(), BadSampleBudget(cfg.data.bad_sample_budget)
    checkpoint = functools.partial(save, cfg, run_dir, model, optimizer, train_loader, budget, device)
    if saved is not None:
        progress = resume(saved, cfg, model, optimizer, train_loader, budget, device)
    loggers = make_loggers(cfg, run_dir, resumed=None if saved is None else progress)
    if progress.epoch >= cfg.train.epochs:
        done = (run_dir, progress.epoch, cfg.train.epochs)
        log.warning("%s already holds %d trained epochs (train.epochs=%d): nothing to do", *done)

    run = Run(cfg, ddp_model, task, optimizer, compute, budget, checkpoint, stop, loggers)
    with loggers, worker_lost_named([train_loader, val_loader], run_dir):
        return run_epochs(cfg, run, model, task, train_loader, val_loader, progress, run_dir)


def run_epochs(cfg, run: Run, model, task, train_loader, val_loader, progress: Progress, run_dir: Path) -> list[dict]:
    """The epochs from ``progress`` on: train, evaluate, checkpoint, log; returns each epoch's metrics."""
    compute, budget, loggers, stop, checkpoint = run.compute, run.budget, run.loggers, run.stop, run.checkpoint
    device = compute.device
    history, wait_warnings, first = [], WaitWarnings(), progress.epoch
    for epoch in range(progress.epoch, cfg.train.epochs):
        start = time.perf_counter() - (progress.partial or {}).get("seconds", 0.0)  # a resumed epoch's first part
        set_epoch(train_loader, epoch)
        planned = plan_epoch(train_loader, cfg, progress)
        train_stats = train_one_epoch(run, train_loader, progress, planned)
        if planned is None:  # a source that cannot count: the epoch just run tells the schedule's length
            progress.epoch_batches = progress.batch
            progress.total_steps = progress.step + progress.batch * (cfg.train.epochs - epoch - 1)
        val_stats = evaluate(model, task, val_loader, compute, budget, cfg.train.max_batches)
        progress.epoch, progress.batch, progress.partial = epoch + 1, 0, None
        bad = dist.all_reduce_sum(torch.tensor([budget.count], dtype=torch.float64, device=device))
        rate = train_stats["samples_per_s"]  # None: a one-batch epoch, not timed
        metrics = {
            "epoch": epoch,
            "step": progress.step,
            "train_loss": train_stats["loss"],
            "val_loss": val_stats["loss"],
            "val_acc": val_stats["acc"],
            "train_samples": train_stats["samples"],
            "val_samples": val_stats["samples"],
            "bad_samples": int(bad.item()),  # summed over ranks (each counts its own)
            "seconds": round(time.perf_counter() - start, 3),
            "samples_per_s": None if rate is None else round(rate, 1),
            **by_rank(train_stats["waits"], train_stats["seconds"]),  # how long training waited for the loader
            "world_size": dist.get_world_size(),
            **entry_metrics(train_loader.dataset, train_stats["entries"]),
        }
        history.append(metrics)
        wait_warnings.epoch(epoch, train_stats["waits"], train_stats["seconds"])
        if dist.is_main_process():  # the epoch's line first: a checkpoint that finds the disk full keeps it
            loggers.log_epoch(epoch, progress.step, metrics)
            val = "no validation sample" if val_stats["samples"] == 0 else "val_loss {:.4f} val_acc {:.3f}"
            log.info(
                "epoch %d: train_loss %.4f %s (%s)",
                epoch,
                metrics["train_loss"],
                val.format(metrics["val_loss"], metrics["val_acc"]),
                "one batch: not timed" if rate is None else f"{rate:.0f} samples/s",
            )
            if val_stats["samples"] == 0 and epoch == first:
                log.warning(
                    "the val split at data.root gave no sample (it is empty, or every sample was bad): val_loss "
                    "and val_acc are null in metrics.jsonl"
                )
        checkpoint(progress, mid_epoch=False)
        if epoch + 1 < cfg.train.epochs and (signum := stop.agreed()):  # a signal during validation
            raise stopped(signum, progress, run_dir)
    return history


@contextlib.contextmanager
def worker_lost_named(loaders: list, run_dir: Path) -> Iterator[None]:
    """A loader worker that died is one line naming it and the checkpoint a rerun resumes from, wherever
    the loop was when it was seen: in the loader's wait, or elsewhere (torch raises a spawned worker's
    death in the training process wherever it is, from its SIGCHLD handler). A source's outage (the
    server or bucket stopped answering) says which checkpoint a rerun resumes from too."""
    saved = run_dir / CHECKPOINT

    def kept() -> str:
        held = f"{saved} holds the last checkpoint" if saved.is_file() else "no checkpoint was written yet"
        return f"{held}: run the same command again to go on from there"

    try:
        yield
    except Outage as e:
        raise Outage(f"{e}; {kept()}") from None
    except Exception as e:
        gone = isinstance(e, (WorkerLost, RuntimeError, ConnectionError, EOFError))  # how a worker's death shows
        named = next((lost for loader in loaders if (lost := loader.lost(5.0 if gone else 0.0))), None)
        if named is None:
            raise
        raise WorkerLost(f"{named}; {kept()}") from None


def stopped(signum: int, progress: Progress, run_dir: Path) -> Stopped:
    """What ends a run stopped by ``signum``, once every rank has its checkpoint on disk."""
    dist.barrier()  # no rank leaves (its launcher would end the others) before rank 0 has written
    name = signal.Signals(signum).name
    return Stopped(
        signum,
        f"stopped by {name} after step {progress.step} (epoch {progress.epoch}, batch {progress.batch}); "
        f"{run_dir / CHECKPOINT} holds it: run the same command again to go on from there",
    )


def plan_epoch(loader, cfg, progress: Progress) -> int | None:
    """The steps every rank takes this epoch (``None``: not known before it ends), and the schedule's length.

    The ranks agree on the fewest (one small collective per epoch): their sources may count
    moments apart, on data that changes.
    """
    planned = dist.agree_min(loader.planned_batches())
    if planned is not None and cfg.train.max_batches:
        planned = min(planned, cfg.train.max_batches)
    if planned == 0:
        raise UserError(
            f"epoch {progress.epoch} has no training batch: each rank's share, split over "
            f"{max(1, loader.num_workers)} worker(s), is smaller than loader.batch_size={cfg.loader.batch_size} "
            "(lower it or loader.num_workers, set loader.drop_last=false, or add data)"
        )
    per_epoch = planned if planned is not None else progress.epoch_batches
    if per_epoch is not None:  # recomputed each epoch: train.epochs may have changed since a checkpoint
        progress.total_steps = progress.step - progress.batch + per_epoch * (cfg.train.epochs - progress.epoch)
    return planned


@dataclasses.dataclass
class Run:
    """What every epoch of a run shares (:func:`fit` builds it; :func:`train_one_epoch` reads it)."""

    cfg: Any
    model: torch.nn.Module  # what trains: DDP-wrapped when distributed
    task: Any  # the objective: task.loss, task.correct (task.py)
    optimizer: torch.optim.Optimizer
    compute: Compute  # the device, precision and loss scaling
    budget: BadSampleBudget
    checkpoint: Callable  # checkpoint(progress, mid_epoch, sums=None): see checkpoint.save
    stop: StopOnSignal | None = None
    loggers: Loggers = NO_LOGGERS


def train_one_epoch(run: Run, loader, progress: Progress, planned: int | None) -> dict:
    """One epoch (the rest of it, after a resume): ``planned`` steps on every rank.

    Returns the mean loss and the number of samples over all ranks, and the seconds taken: of
    the whole epoch, its part before a resume included (``progress.partial``).
    """
    cfg, model, compute, device = run.cfg, run.model, run.compute, run.compute.device
    model.train()
    carried = (progress.partial if dist.is_main_process() else None) or {}  # summed over ranks: rank 0 adds it
    own_wait = own_carried_wait(progress.partial)
    start = time.perf_counter() - carried.get("seconds", 0.0)
    loss_sum = torch.full((), carried.get("loss", 0.0), dtype=torch.float64, device=device)
    samples, last = carried.get("samples", 0), None
    names = list(loader.dataset.shares()) if cfg.data.mix else []  # a mix counts each entry's samples
    entries = np.array(carried.get("entries") or [0] * len(names), dtype=np.int64)
    todo = None if planned is None else planned - progress.batch
    if todo is not None and todo <= 0:
        # Resumed from a checkpoint on the epoch's last step: the loader holds the position at the
        # epoch's end, which its next iterator would continue into (and end at once). This one does.
        next(iter(loader), None)

    def spare() -> dict:  # finished on the device as a batch of the loader is (on_device)
        return run.task.on_device(spare_batch(loader.dataset, run.task), device)

    bar = tqdm(
        total=planned,
        initial=progress.batch,
        desc=f"epoch {progress.epoch}",
        disable=not (dist.is_main_process() and sys.stderr.isatty()),
        leave=False,
    )
    guard = FiniteGuard(device, cfg.train.log_every, Path(cfg.train.run_dir) / CHECKPOINT)
    wait = DataWait(own_wait)
    for batch in even_batches(wait.timed(loader), todo):
        if batch is not None:
            batch = run.task.on_device(batch, device)  # what the format finishes there: a bad sample joins batch["bad"]
            run.budget.update(batch["bad"])
            if names:
                entries += entry_counts(batch["key"], names)
        progress.batch += 1
        bar.update()
        if (batch is None or not batch["key"]) and not dist.is_distributed():
            continue  # one process has no replica to keep in step: no stand-in step
        batch, n, last = trainable(batch, last, spare)
        lr = learning_rate(progress.step, progress.total_steps, cfg.optim)
        set_learning_rate(run.optimizer, lr)
        loss = train_step(model, run.task, run.optimizer, batch, compute, weight=1.0 if n else 0.0)
        loss_sum += loss * n
        samples, progress.step = samples + n, progress.step + 1
        guard.record(loss, progress, batch["key"])
        if progress.step % cfg.train.log_every == 0:
            guard.check(model)  # reads the device once per interval, like the loss below
            waited = wait.seconds / max(time.perf_counter() - start, 1e-9)
            running = loss_sum.item() / max(samples, 1)  # this rank's mean over the epoch so far
            bar.set_postfix(loss=f"{running:.3f}", data_wait=f"{waited:.0%}")
            run.loggers.log_step(progress.step, {"loss": running, "lr": lr, "data_wait_frac": waited})
        signum = run.stop.agreed() if run.stop is not None else None  # one small collective a step (stopping.py)
        if signum or (cfg.train.checkpoint_every and progress.step % cfg.train.checkpoint_every == 0):
            guard.check(model)  # only finite weights are ever written
            sums = {"loss": loss_sum.item(), "samples": samples, "seconds": time.perf_counter() - start}
            sums |= {"wait_s": wait.seconds, "entries": entries.tolist() if names else None}
            run.checkpoint(progress, mid_epoch=True, sums=sums)
        if signum:
            bar.close()
            raise stopped(signum, progress, Path(cfg.train.run_dir))
        if todo is None and cfg.train.max_batches and progress.batch >= cfg.train.max_batches:
            break
    bar.close()
    guard.check(model)
    waits = [0.0] * dist.get_world_size()
    waits[dist.get_rank()] = wait.seconds  # summed over ranks: each rank's wait in its own place
    host = torch.tensor([float(samples), *waits, *entries.tolist()], dtype=torch.float64, device=device)
    totals = dist.all_reduce_sum(torch.cat([loss_sum.reshape(1), host])).tolist()
    loss_total, samples_total = totals[0], totals[1]
    waits, by_entry = totals[2 : 2 + len(waits)], totals[2 + len(waits) :]
    seconds = time.perf_counter() - start
    loss = loss_total / max(samples_total, 1)
    # the rate of this process's part of the epoch after its first batch, which waits for the workers to
    # start (a smoke run's few batches too; an epoch resumed midway: its part after the resume)
    after = samples_total - carried.get("samples", 0) - wait.first
    # (None, not timed, where only one batch came: the workers' start is all there is to time)
    rate = after / max(time.perf_counter() - wait.first_at, 1e-9) if wait.batches > 1 else None
    return {
        "loss": loss,
        "samples": int(samples_total),
        "seconds": seconds,
        "waits": waits,  # each rank's seconds waiting for data
        "samples_per_s": rate,
        "entries": dict(zip(names, map(int, by_entry), strict=True)),
    }


def even_batches(batches, planned: int | None):
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


def trainable(batch: dict | None, last: dict | None, spare) -> tuple[dict, int, dict]:
    """The batch to step on, its number of real samples, and the latest batch with 2 or more.

    # NOTE [ No batch of 0 or 1 reaches the model ]
    # Bad samples are dropped from their batch, and a rank may run out of data before the
    # planned step count. Yet every rank must take every step (DDP all-reduces in backward),
    # and a training batch of 1 breaks BatchNorm. So a batch of one sample is that sample
    # twice (the same mean loss), and an empty one, or none, is replaced by this rank's
    # previous batch (or, before it has one, by ``spare()``) with zero weight. With zero
    # gradients on this rank, DDP's averaged gradients are still the same on every rank, so
    # the replicas stay identical (AdamW's momentum and weight decay still move them, alike).
    """
    n = 0 if batch is None else len(batch["key"])
    if n >= 2:
        return batch, n, batch
    if n == 1:
        return {k: torch.cat([v, v]) if torch.is_tensor(v) else v * 2 for k, v in batch.items()}, 1, last
    last = last if last is not None else spare()
    return last, 0, last


def spare_batch(dataset, task) -> dict:
    """Two readable training samples, batched: a stand-in for a rank with no batch of its own yet.

    Taken from the source's first samples (``peek``), read with ``task``, so the loader's position is
    not touched.
    """
    good = []
    with generators_kept():  # the model's random numbers run on as in a run that needs no stand-in
        for data in dataset.peek(16):
            with contextlib.suppress(Exception):  # a bad sample: the next one may do
                good.append({"input": task(data), "target": 0, "key": "(stand-in)"})
            if len(good) == 2:
                return task.collate(good)
    raise UserError(f"rank {dist.get_rank()} found fewer than 2 readable training samples; check data.root")


@torch.no_grad()
def evaluate(model, task, loader, compute: Compute, budget: BadSampleBudget, max_batches: int = 0) -> dict:
    """Validation loss, accuracy and sample count over all ranks (each sample once; the first ``max_batches``
    of each rank with ``train.max_batches``, a smoke run's)."""
    model.eval()
    sums = torch.zeros(3, dtype=torch.float64, device=compute.device)  # loss x n, correct, n
    for batch in itertools.islice(loader, max_batches or None):
        budget.update(batch["bad"])
        n = len(batch["key"])
        if n == 0:
            continue  # every sample of the batch was bad
        inputs, target = compute.inputs(task, batch)
        with compute.autocast():
            logits = model(*inputs)
        sums[0] += task.loss(logits, target) * n
        sums[1] += task.correct(logits, target)
        sums[2] += n
    loss_sum, correct, n = dist.all_reduce_sum(sums).tolist()
    if n == 0:  # no validation sample (an empty split, or every one bad): nothing to report, not a 0
        return {"loss": None, "acc": None, "samples": 0}
    return {"loss": loss_sum / n, "acc": correct / n, "samples": int(n)}


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def ensure_tuned(cfg, dataset) -> None:
    """Run the quick benchmark (rank 0) when ``configs/tuned.yaml`` is missing or stale."""
    from .bench import quick_bench  # bench times loaders and the model; train needs it only here
    from .data.settings import tuned_settings

    if not cfg.loader.tuned:
        return
    if dist.is_main_process() and tuned_settings(cfg, dataset) is None:
        log.info("no tuned loader settings for this data and machine: running `bench --quick`")
        quick_bench(cfg, dataset)
    dist.barrier()  # every rank, whatever it would have decided: a rank skipping it would hang the rest
