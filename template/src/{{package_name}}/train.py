"""Training loop: DDP-aware, bf16 autocast on CUDA, atomic checkpoints, resume.

One process:       python -m <package> train train.epochs=5
N processes:       python -m <package> launch --nproc-per-node N -- train train.epochs=5
          (same as torchrun --standalone --nproc-per-node N -m <package> train ...)
"""

from __future__ import annotations

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
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from tqdm import tqdm

from . import dist, project
from .checkpoint import CHECKPOINT, load_checkpoint, resume_path, rng_state, save_checkpoint, set_rng_state
from .data import BadSampleBudget, build_dataset, build_loader, set_epoch
from .data.loader import estimated_batches
from .data.transforms import normalize_on_device
from .model import build_model

log = logging.getLogger(__name__)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def forward_loss(model, batch: dict, device: torch.device, amp: bool):
    """Loss (mean over the batch's good samples), number of correct predictions, samples."""
    x = batch["input"].to(device, non_blocking=True)
    target = batch["target"].to(device, non_blocking=True)
    mask = batch["mask"].to(device, non_blocking=True) if "mask" in batch else None
    if project.DATA_FORMAT == "image":
        x = normalize_on_device(x)
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
        logits = model(x, mask)
    n = target.numel()
    # sum / max(n, 1): a batch whose samples were all skipped still runs backward with zero
    # gradients, so every DDP rank takes part in every all-reduce.
    loss = F.cross_entropy(logits.float(), target, reduction="sum") / max(n, 1)
    correct = (logits.argmax(1) == target).sum().item()
    return loss, correct, n


@torch.no_grad()
def evaluate(model, loader, device, amp: bool, budget: BadSampleBudget) -> tuple[float, float, int]:
    """Validation loss, accuracy and sample count summed over all ranks (each sample once)."""
    model.eval()
    loss_sum, correct, n = 0.0, 0, 0
    for batch in loader:
        budget.update(batch["bad"])
        loss, c, k = forward_loss(model, batch, device, amp)
        loss_sum, correct, n = loss_sum + loss.item() * k, correct + c, n + k
    loss_sum, correct, n = dist.all_reduce_sum([loss_sum, correct, n], device)
    return loss_sum / max(n, 1), correct / max(n, 1), int(n)


def ensure_tuned(cfg, dataset) -> None:
    """Run the quick benchmark (rank 0) when ``configs/tuned.yaml`` is missing or stale."""
    from .bench import quick_bench  # bench imports the data stack; keep `train` importable alone
    from .data.tuned import read_tuned

    if not cfg.loader.tuned:
        return
    if dist.is_main_process() and read_tuned(cfg, dataset) is None:
        log.info("no tuned loader settings for this data and machine: running `bench --quick`")
        quick_bench(cfg, dataset)
    dist.barrier()  # every rank, whatever it would have decided: a rank skipping it would hang the rest


def train(cfg) -> list[dict]:
    """Train for ``cfg.train.epochs``; returns the per-epoch metrics (as in metrics.jsonl)."""
    device = dist.pick_device(project.NUM_GPUS)
    distributed = dist.setup(cfg.dist.backend, cfg.dist.timeout_s, device)
    rank, main = dist.get_rank(), dist.is_main_process()
    run_dir = Path(cfg.train.run_dir)
    if main:
        run_dir.mkdir(parents=True, exist_ok=True)
    seed_everything(cfg.train.seed + 1000 * rank)

    train_ds, val_ds = build_dataset(cfg, "train"), build_dataset(cfg, "val")
    ensure_tuned(cfg, train_ds)
    train_loader = build_loader(train_ds, cfg, "train")
    val_loader = build_loader(val_ds, cfg, "val")

    model = build_model(project.DATA_FORMAT, len(train_ds.classes), train_ds.fmt.sample_shape()).to(device)
    ddp_model = DDP(model, device_ids=[device.index] if device.type == "cuda" else None) if distributed else model
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.train.lr, weight_decay=cfg.train.weight_decay)
    stream = isinstance(train_ds, torch.utils.data.IterableDataset)
    # The fewest over all ranks (None: a stream of unknown length), so that every rank follows the
    # same learning-rate schedule and stops a capped epoch at the same step.
    steps_per_epoch = dist.agree_min(estimated_batches(train_loader), device)
    if cfg.train.max_batches:
        steps_per_epoch = min(steps_per_epoch or cfg.train.max_batches, cfg.train.max_batches)
    # Cosine decay over the whole run; for a stream of unknown length the horizon is set from
    # the first epoch's batch count, and the learning rate stays at its peak until then.
    horizon = {"steps": steps_per_epoch * cfg.train.epochs if steps_per_epoch else None}
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer,
        lambda s: 1.0 if not horizon["steps"] else 0.5 * (1 + math.cos(math.pi * min(s / horizon["steps"], 1))),
    )
    amp = device.type == "cuda" and cfg.train.amp in (True, "auto")

    first_epoch, batch_in_epoch, step = 0, 0, 0
    consumed: dict[int, int] = {}  # stream rows this rank's workers yielded this epoch, by worker
    ckpt = dist.broadcast_from_main(resume_path(cfg.train.resume, run_dir) if main else None)
    if ckpt is not None:
        if not ckpt.is_file():
            raise FileNotFoundError(
                f"rank {rank} cannot read {ckpt}, which rank 0 resumes from: put train.run_dir "
                "on a filesystem every node shares, or pass train.resume=never"
            )
        state = load_checkpoint(ckpt)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        horizon["steps"] = horizon["steps"] or state.get("horizon")
        first_epoch, batch_in_epoch, step = state["epoch"], state["batch_in_epoch"], state["step"]
        if batch_in_epoch and not _same_layout(state, train_loader, cfg, first_epoch):
            batch_in_epoch = 0  # the epoch restarts; the step count goes on
        elif stream and batch_in_epoch:
            train_loader.dataset.resume = (first_epoch, dict(state["stream_rows"][rank]))
            consumed = dict(state["stream_rows"][rank])
        if main:
            set_rng_state(state["rng"])
            log.info("resumed from %s at epoch %d, step %d", ckpt, first_epoch, step)
    elif main:
        (run_dir / "metrics.jsonl").unlink(missing_ok=True)  # a fresh run: not appended to an old one's

    def checkpoint(epoch: int, batch_in_epoch: int) -> None:
        rows = dist.all_gather_object(consumed) if stream else None  # every rank takes part
        if main:
            state = {
                "model": model.state_dict(),
                "optimizer": optimizer.state_dict(),
                "scheduler": scheduler.state_dict(),
                "epoch": epoch,
                "batch_in_epoch": batch_in_epoch,
                "step": step,
                "horizon": horizon["steps"],
                "stream_rows": rows,
                "layout": _layout(train_loader, cfg),
                "config": cfg.to_dict(),
                "rng": rng_state(),
            }
            save_checkpoint(run_dir / CHECKPOINT, state)

    budget = BadSampleBudget(cfg.data.bad_sample_budget)
    history = []
    for epoch in range(first_epoch, cfg.train.epochs):
        start = time.perf_counter()
        set_epoch(train_loader, epoch)
        if batch_in_epoch and not stream:  # resumed mid-epoch: skip what the saved run already saw
            train_loader.sampler.skip(batch_in_epoch * cfg.loader.batch_size)
        ddp_model.train()
        loss_sum, samples, batches = 0.0, 0, 0
        batches_iter, planned = train_loader, steps_per_epoch
        if stream:  # every rank stops at the same step; shards with an index know it in advance
            planned = dist.agree_min(estimated_batches(train_loader), device)
            exact = planned - batch_in_epoch if planned is not None and hasattr(train_ds, "exact_batches") else None
            batches_iter = itertools.islice(dist.stop_together(train_loader, device), exact)
            if planned and cfg.train.max_batches:
                planned = min(planned, cfg.train.max_batches)
        bar = tqdm(
            batches_iter,
            desc=f"epoch {epoch}",
            total=planned,
            disable=not (main and sys.stderr.isatty()),
            leave=False,
        )
        for batch in bar:
            budget.update(batch["bad"])
            consumed[batch["worker"]] = consumed.get(batch["worker"], 0) + len(batch["key"]) + len(batch["bad"])
            loss, _, n = forward_loss(ddp_model, batch, device, amp)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            scheduler.step()
            step, batch_in_epoch, batches = step + 1, batch_in_epoch + 1, batches + 1
            loss_sum, samples = loss_sum + loss.item() * n, samples + n
            bar.set_postfix(loss=f"{loss.item():.3f}", refresh=False)
            if cfg.train.checkpoint_every and step % cfg.train.checkpoint_every == 0:
                checkpoint(epoch, batch_in_epoch)
            if steps_per_epoch and cfg.train.max_batches and batch_in_epoch >= steps_per_epoch:
                break
        if horizon["steps"] is None:
            horizon["steps"] = max(1, batch_in_epoch) * cfg.train.epochs
        train_seconds = time.perf_counter() - start
        loss_sum, samples = dist.all_reduce_sum([loss_sum, samples], device)
        val_loss, val_acc, val_samples = evaluate(model, val_loader, device, amp, budget)
        dist.check_in_sync(model, device)
        lo, hi = dist.all_reduce_min_max(batches, device)
        (bad_samples,) = dist.all_reduce_sum([budget.count], device)
        batch_in_epoch, consumed = 0, {}
        checkpoint(epoch + 1, 0)
        metrics = {
            "epoch": epoch,
            "step": step,
            "train_loss": loss_sum / max(samples, 1),
            "val_loss": val_loss,
            "val_acc": val_acc,
            "train_samples": int(samples),
            "val_samples": val_samples,
            "bad_samples": int(bad_samples),  # summed over ranks (each counts its own, per process)
            "seconds": round(time.perf_counter() - start, 3),
            "samples_per_s": round(samples / train_seconds, 1),
            "world_size": dist.get_world_size(),
            "rank_batches": [lo, hi],  # fewest and most training batches of any rank: equal
        }
        history.append(metrics)
        if main:
            with open(run_dir / "metrics.jsonl", "a", encoding="utf-8") as f:
                f.write(json.dumps(metrics) + "\n")
            log.info(
                "epoch %d: train_loss %.4f val_loss %.4f val_acc %.3f (%d samples/s)",
                epoch,
                metrics["train_loss"],
                val_loss,
                val_acc,
                metrics["samples_per_s"],
            )
    dist.teardown()
    return history


def _layout(loader, cfg) -> dict:
    """What a mid-epoch position depends on: a resumed run continues it only if all match."""
    return {
        "world_size": dist.get_world_size(),
        "batch_size": cfg.loader.batch_size,
        "num_workers": loader.num_workers,
        "drop_last": cfg.loader.drop_last,
    }


def _same_layout(state: dict, loader, cfg, epoch: int) -> bool:
    """Whether the checkpoint's mid-epoch position means the same here; warns when it does not.

    A map-style run skips ``batch_in_epoch`` batches of the epoch's permutation; a stream's
    workers skip the rows they had consumed, replaying the same shuffle (seeded by seed, epoch,
    rank and worker). Both need the same world size and batch size, and a stream the same
    ``num_workers``; otherwise the epoch restarts from its beginning rather than repeat or
    skip samples.
    """
    saved, now = state.get("layout", {}), _layout(loader, cfg)
    keys = ("world_size", "batch_size", "drop_last") + (("num_workers",) if state.get("stream_rows") else ())
    changed = {k: (saved.get(k), now[k]) for k in keys if saved.get(k) != now[k]}
    if changed:
        what = ", ".join(f"{k} {old} -> {new}" for k, (old, new) in changed.items())
        log.warning("%s since the checkpoint: epoch %d restarts from its beginning", what, epoch)
    return not changed
