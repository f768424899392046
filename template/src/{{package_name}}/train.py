"""Training: :func:`main` sets a run up; :func:`train_one_epoch` and :func:`evaluate` are its loops.

One process:    python -m <package> train train.epochs=5
N processes:    python -m <package> launch --nproc-per-node N -- train train.epochs=5
                (the same as torchrun --standalone --nproc-per-node N -m <package> train ...)

What a batch means (its move to the device, the loss, the metric) is the task's (task.py); the
model is build_model's (model.py). The loop reads nothing back from the device between log
intervals: losses and counts add up on the device and are read every ``train.log_every`` steps.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import json
import logging
import math
import random
import sys
import time
from pathlib import Path

import numpy as np
import torch
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import IterableDataset
from tqdm import tqdm

from . import dist, project
from .checkpoint import CHECKPOINT, load_checkpoint, resume_path, rng_state, save_checkpoint, set_rng_state
from .data import build_dataset, build_loader, planned_batches, set_epoch
from .data.budget import BadSampleBudget
from .data.loader import even_batches
from .errors import UserError
from .model import build_model

log = logging.getLogger(__name__)


@dataclasses.dataclass
class Progress:
    """Where a run stands: what a checkpoint records and a resumed run continues from."""

    epoch: int = 0  # the epoch running, or the next one between epochs
    batch: int = 0  # batches of that epoch already trained
    step: int = 0  # optimizer steps since the run began
    total_steps: int | None = None  # the learning-rate schedule's length (None: not known yet)


def main(cfg) -> list[dict]:
    """Train for ``cfg.train.epochs``; returns the per-epoch metrics (as in ``metrics.jsonl``)."""
    device = dist.pick_device(project.NUM_GPUS)
    dist.setup(cfg.dist.backend, cfg.dist.timeout_s, device)
    try:
        return fit(cfg, device)
    finally:
        dist.teardown()


def fit(cfg, device: torch.device) -> list[dict]:
    """Build the data, model and optimizer, resume if there is a checkpoint, and run the epochs."""
    run_dir = Path(cfg.train.run_dir)
    if dist.is_main_process():
        run_dir.mkdir(parents=True, exist_ok=True)
    seed_everything(cfg.train.seed + 1000 * dist.get_rank())
    train_set, val_set = build_dataset(cfg, "train"), build_dataset(cfg, "val")
    ensure_tuned(cfg, train_set)
    saved = find_checkpoint(cfg, run_dir)
    train_loader = build_loader(train_set, keep_saved_workers(cfg, saved), "train")
    val_loader = build_loader(val_set, cfg, "val")
    task = train_set.task

    model = build_model(cfg, train_set.num_classes, task.sample_shape).to(device)
    ddp_model = model
    if dist.is_distributed():
        ddp_model = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.train.lr, weight_decay=cfg.train.weight_decay)
    amp = device.type == "cuda" and cfg.train.amp in (True, "auto")
    checkpoint = functools.partial(save, cfg, run_dir, model, optimizer, train_loader, device)

    progress = Progress()
    if saved is not None:
        progress = resume(saved, cfg, model, optimizer, train_loader, device)
    elif dist.is_main_process():
        (run_dir / "metrics.jsonl").unlink(missing_ok=True)  # a fresh run: not appended to an old one's
    if progress.epoch >= cfg.train.epochs:
        done = (run_dir, progress.epoch, cfg.train.epochs)
        log.warning("%s already holds %d trained epochs (train.epochs=%d): nothing to do", *done)

    budget = BadSampleBudget(cfg.data.bad_sample_budget)
    history = []
    for epoch in range(progress.epoch, cfg.train.epochs):
        start = time.perf_counter()
        set_epoch(train_loader, epoch)
        planned = planned_batches(train_loader)
        if planned is not None and cfg.train.max_batches:
            planned = min(planned, cfg.train.max_batches)
        if progress.total_steps is None and planned is not None:
            progress.total_steps = progress.step - progress.batch + planned * (cfg.train.epochs - epoch)
        train_stats = train_one_epoch(
            ddp_model, task, optimizer, train_loader, device, cfg, progress, planned, budget, amp, checkpoint
        )
        if progress.total_steps is None:  # a source of unknown length: its first epoch sets the schedule
            progress.total_steps = progress.step + train_stats["batches"] * (cfg.train.epochs - epoch - 1)
        val_stats = evaluate(model, task, val_loader, device, amp, budget)
        progress.epoch, progress.batch = epoch + 1, 0
        checkpoint(progress, mid_epoch=False)
        bad = dist.all_reduce_sum(torch.tensor([budget.count], dtype=torch.float64, device=device))
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
            "samples_per_s": round(train_stats["samples"] / max(train_stats["seconds"], 1e-9), 1),
            "world_size": dist.get_world_size(),
        }
        history.append(metrics)
        if dist.is_main_process():
            with open(run_dir / "metrics.jsonl", "a", encoding="utf-8") as f:
                f.write(json.dumps(metrics) + "\n")
            log.info(
                "epoch %d: train_loss %.4f val_loss %.4f val_acc %.3f (%d samples/s)",
                *(metrics[k] for k in ("epoch", "train_loss", "val_loss", "val_acc", "samples_per_s")),
            )
    return history


def train_one_epoch(
    model, task, optimizer, loader, device, cfg, progress: Progress, planned, budget, amp: bool, checkpoint
) -> dict:
    """One epoch (the rest of it, after a resume): ``planned`` steps on every rank.

    Returns the mean loss and the number of samples over all ranks, the batches of this rank,
    and the seconds taken.
    """
    model.train()
    start = time.perf_counter()
    loss_sum = torch.zeros((), dtype=torch.float64, device=device)
    samples, last, batches = 0, None, 0
    todo = None if planned is None else planned - progress.batch
    spare = functools.partial(spare_batch, loader.dataset)
    bar = tqdm(
        total=planned,
        initial=progress.batch,
        desc=f"epoch {progress.epoch}",
        disable=not (dist.is_main_process() and sys.stderr.isatty()),
        leave=False,
    )
    for batch in even_batches(loader, todo):
        if batch is not None:
            budget.update(batch["bad"])
        batch, n, last = trainable(batch, last, spare)
        set_learning_rate(optimizer, learning_rate(progress.step, progress.total_steps, cfg.train.lr))
        loss = train_step(model, task, optimizer, batch, device, amp, weight=1.0 if n else 0.0)
        loss_sum += loss * n
        samples, batches = samples + n, batches + 1
        progress.step, progress.batch = progress.step + 1, progress.batch + 1
        bar.update()
        if progress.step % cfg.train.log_every == 0:
            bar.set_postfix(loss=f"{loss_sum.item() / max(samples, 1):.3f}")  # one read per interval
        if cfg.train.checkpoint_every and progress.step % cfg.train.checkpoint_every == 0:
            checkpoint(progress, mid_epoch=True)
        if todo is None and cfg.train.max_batches and progress.batch >= cfg.train.max_batches:
            break
    bar.close()
    totals = dist.all_reduce_sum(torch.stack([loss_sum, torch.tensor(float(samples), device=device)]))
    loss_total, samples_total = totals.tolist()
    seconds = time.perf_counter() - start
    loss = loss_total / max(samples_total, 1)
    return {"loss": loss, "samples": int(samples_total), "batches": batches, "seconds": seconds}


def train_step(model, task, optimizer, batch: dict, device, amp: bool, weight: float = 1.0) -> torch.Tensor:
    """Forward, backward and an optimizer step on one batch; returns the (detached) mean loss.

    ``weight=0`` is a stand-in step: it takes part in DDP's all-reduce with zero gradients, so
    every rank takes the same steps.
    """
    inputs, target = task.to_device(batch, device)
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
        logits = model(*inputs)
    loss = task.loss(logits, target)
    optimizer.zero_grad(set_to_none=True)
    (loss * weight).backward()
    optimizer.step()
    return loss.detach()


def trainable(batch: dict | None, last: dict | None, spare) -> tuple[dict, int, dict]:
    """The batch to step on, its number of real samples, and the latest batch with 2 or more.

    # NOTE [ No batch of 0 or 1 reaches the model ]
    # Bad samples are dropped from their batch, and a rank may run out of data before the
    # planned step count. Yet every rank must take every step (DDP all-reduces in backward),
    # and a training batch of 1 breaks BatchNorm. So a batch of one sample is that sample
    # twice (the same mean loss), and an empty one, or none, is replaced by this rank's
    # previous batch (or, before it has one, by ``spare()``) with zero weight.
    """
    n = 0 if batch is None else len(batch["key"])
    if n >= 2:
        return batch, n, batch
    if n == 1:
        return {k: torch.cat([v, v]) if torch.is_tensor(v) else v * 2 for k, v in batch.items()}, 1, last
    last = last if last is not None else spare()
    return last, 0, last


def spare_batch(dataset) -> dict:
    """Two good samples of ``dataset``, batched: a stand-in for a rank with no batch of its own yet."""
    items = iter(dataset) if isinstance(dataset, IterableDataset) else map(dataset.__getitem__, range(len(dataset)))
    good = list(itertools.islice((s for s in items if "bad" not in s), 2))
    if len(good) < 2:
        raise UserError(f"rank {dist.get_rank()} found fewer than 2 readable training samples; check data.root")
    return dataset.task.collate(good)


@torch.no_grad()
def evaluate(model, task, loader, device, amp: bool, budget: BadSampleBudget) -> dict:
    """Validation loss, accuracy and sample count over all ranks (each sample once)."""
    model.eval()
    sums = torch.zeros(3, dtype=torch.float64, device=device)  # loss x n, correct, n
    for batch in loader:
        budget.update(batch["bad"])
        n = len(batch["key"])
        if n == 0:
            continue  # every sample of the batch was bad
        inputs, target = task.to_device(batch, device)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
            logits = model(*inputs)
        sums[0] += task.loss(logits, target) * n
        sums[1] += task.correct(logits, target)
        sums[2] += n
    loss_sum, correct, n = dist.all_reduce_sum(sums).tolist()
    return {"loss": loss_sum / max(n, 1), "acc": correct / max(n, 1), "samples": int(n)}


def learning_rate(step: int, total_steps: int | None, peak: float) -> float:
    """Cosine decay from ``peak`` to 0 over ``total_steps`` (``peak`` while the length is unknown).

    >>> learning_rate(0, 100, 1.0), learning_rate(50, 100, 1.0), learning_rate(100, 100, 1.0)
    (1.0, 0.5, 0.0)
    """
    if not total_steps:
        return peak
    return 0.5 * peak * (1 + math.cos(math.pi * min(step / total_steps, 1.0)))


def set_learning_rate(optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def ensure_tuned(cfg, dataset) -> None:
    """Run the quick benchmark (rank 0) when ``configs/tuned.yaml`` is missing or stale."""
    from .bench import quick_bench  # bench imports the whole data stack; train needs it only here
    from .data.tuned import read_tuned

    if not cfg.loader.tuned:
        return
    if dist.is_main_process() and read_tuned(cfg, dataset) is None:
        log.info("no tuned loader settings for this data and machine: running `bench --quick`")
        quick_bench(cfg, dataset)
    dist.barrier()  # every rank, whatever it would have decided: a rank skipping it would hang the rest


# --- checkpoints -----------------------------------------------------------------------------


def layout(cfg, loader) -> dict:
    """What a position inside an epoch depends on: a resumed run continues it only if all match."""
    return {
        "world_size": dist.get_world_size(),
        "batch_size": cfg.loader.batch_size,
        "num_workers": loader.num_workers,
        "drop_last": cfg.loader.drop_last,
    }


def save(cfg, run_dir: Path, model, optimizer, loader, device, progress: Progress, mid_epoch: bool) -> None:
    """Write the checkpoint (rank 0); every rank hands in its loader position and RNGs."""
    mine = {"loader": loader.state_dict() if mid_epoch else None, "rng": rng_state(device)}
    ranks = dist.all_gather_object(mine)  # a collective at checkpoints only
    if dist.is_main_process():
        state = {
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "progress": dataclasses.asdict(progress),
            "layout": layout(cfg, loader),
            "loader": [r["loader"] for r in ranks],
            "rng": [r["rng"] for r in ranks],
            "config": cfg.to_dict(),
        }
        save_checkpoint(run_dir / CHECKPOINT, state)


def find_checkpoint(cfg, run_dir: Path) -> dict | None:
    """The checkpoint to resume from (rank 0 picks it; every rank loads it), or ``None``."""
    path = dist.broadcast_from_main(resume_path(cfg.train.resume, run_dir) if dist.is_main_process() else None)
    if path is None:
        return None
    if not path.is_file():
        raise UserError(
            f"rank {dist.get_rank()} cannot read {path}, which rank 0 resumes from: put train.run_dir on a "
            "filesystem every node shares, or pass train.resume=never"
        )
    state = load_checkpoint(path)
    state["path"] = path
    return state


def keep_saved_workers(cfg, saved: dict | None):
    """The config, with a mid-epoch checkpoint's ``num_workers`` when ``loader.num_workers`` is auto.

    The loader's position is per worker; an automatic choice keeps the saved count rather than
    restart the epoch (an explicit, different value restarts it).
    """
    if saved is None or not any(saved["loader"]) or cfg.loader.num_workers != "auto":
        return cfg
    kept = dataclasses.replace(cfg, loader=dataclasses.replace(cfg.loader, num_workers=saved["layout"]["num_workers"]))
    return kept


def resume(saved: dict, cfg, model, optimizer, loader, device) -> Progress:
    """Load the model, optimizer, this rank's RNGs and loader position; returns where to continue."""
    try:
        model.load_state_dict(saved["model"])
    except RuntimeError as e:
        raise UserError(
            f"{saved['path']} holds weights of another model ({str(e).splitlines()[1].strip()}): start a new run "
            "with train.resume=never (or another train.run_dir)"
        ) from None
    optimizer.load_state_dict(saved["optimizer"])
    progress = Progress(**saved["progress"])
    rank, world_size = dist.get_rank(), dist.get_world_size()
    if len(saved["rng"]) == world_size:
        set_rng_state(saved["rng"][rank], device)
    if progress.batch:
        changed = {k: (v, layout(cfg, loader)[k]) for k, v in saved["layout"].items() if layout(cfg, loader)[k] != v}
        if changed:
            what = ", ".join(f"{k} {old} -> {new}" for k, (old, new) in changed.items())
            log.warning("%s since the checkpoint: epoch %d restarts from its beginning", what, progress.epoch)
            progress.batch = 0
        else:
            loader.load_state_dict(saved["loader"][rank])
    where = (saved["path"], progress.epoch, progress.batch, progress.step)
    log.info("resumed from %s at epoch %d, batch %d, step %d", *where)
    return progress
