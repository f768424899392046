# torchfeed's file: `copier update` replaces it. Your model is model.py; your augmentations, loss and
# metric are task.py; your settings configs/default.yaml (README.md: "Which files are yours").
"""Where a run's numbers go: ``metrics.jsonl`` always, TensorBoard with ``train.tensorboard=true``.

    with make_loggers(cfg, run_dir, resumed=progress if saved else None) as loggers:
        loggers.log_step(step, {"loss": 0.41, "lr": 3e-3})
        loggers.log_epoch(epoch, step, metrics)

Rank 0 logs (the other ranks get no logger). The loop hands in per-step scalars only every
``train.log_every`` steps, when it reads the loss from the device anyway, and each epoch's
metrics once, after its checkpoint.

A resumed run is the same run: ``metrics.jsonl`` goes on from the epoch it resumes (the lines of
epochs it trains again are dropped; a fresh run starts the file anew), and TensorBoard writes into
the same folder with ``purge_step``, so the steps an interrupted run logged after its last
checkpoint are dropped and each step shows once.

Your own logger (Weights & Biases, MLflow, a CSV) is a class with these three methods, added
to the list in :func:`make_loggers`.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Protocol

from . import dist
from .errors import DiskFull, UserError, is_disk_full

METRICS = "metrics.jsonl"
TENSORBOARD = "tensorboard"  # the event files' folder, in train.run_dir


class Logger(Protocol):
    def log_step(self, step: int, scalars: dict[str, float]) -> None: ...

    def log_epoch(self, epoch: int, step: int, metrics: dict) -> None: ...

    def close(self) -> None: ...


def make_loggers(cfg, run_dir: Path, resumed=None) -> Loggers:
    """This rank's loggers: rank 0's, or none. ``resumed``: the progress a resumed run goes on from
    (checkpoint.Progress: its ``epoch`` and ``step``)."""
    if not dist.is_main_process():
        return Loggers([])
    loggers: list[Logger] = [JsonLines(run_dir / METRICS, None if resumed is None else resumed.epoch)]
    if cfg.train.tensorboard:
        loggers.append(TensorBoard(run_dir / TENSORBOARD, None if resumed is None else resumed.step))
    return Loggers(loggers)


class Loggers:
    """Hands each call to every logger; closes them all when its ``with`` block ends."""

    def __init__(self, loggers: list[Logger]):
        self.loggers = loggers

    def log_step(self, step: int, scalars: dict[str, float]) -> None:
        for logger in self.loggers:
            logger.log_step(step, scalars)

    def log_epoch(self, epoch: int, step: int, metrics: dict) -> None:
        for logger in self.loggers:
            logger.log_epoch(epoch, step, metrics)

    def __enter__(self) -> Loggers:
        return self

    def __exit__(self, *exc) -> None:
        for logger in self.loggers:
            logger.close()


class JsonLines:
    """One line per epoch in ``metrics.jsonl``; a full disk is :class:`DiskFull` naming the file."""

    def __init__(self, path: Path, resumed_epoch: int | None):
        self.path = path
        if resumed_epoch is None:
            path.unlink(missing_ok=True)  # a fresh run: not appended to an old one's
        elif path.is_file():  # the lines of the epochs a resumed run trains again go: each epoch shows once
            lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
            kept = [line for line in lines if _epoch_of(line) is not None and _epoch_of(line) < resumed_epoch]
            if kept != lines:
                path.write_text("".join(kept), encoding="utf-8")

    def log_step(self, step: int, scalars: dict[str, float]) -> None:
        pass

    def log_epoch(self, epoch: int, step: int, metrics: dict) -> None:
        try:
            with open(self.path, "a", encoding="utf-8") as f:
                f.write(json.dumps(metrics) + "\n")
        except OSError as e:
            if not is_disk_full(e):
                raise
            raise DiskFull(
                f"{e.strerror.lower()} writing {self.path}: epoch {epoch}'s line is not written, nor its checkpoint; "
                "free some space and run the same command again, which trains it again from the last checkpoint"
            ) from None

    def close(self) -> None:
        pass


class TensorBoard:
    """Per-step scalars as ``train/<name>``, each epoch's metrics as ``epoch/<name>`` (a list of one number
    per rank as ``epoch/<name>/<rank>``), against the step."""

    def __init__(self, folder: Path, resumed_at: int | None):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            raise UserError(
                'train.tensorboard=true needs the tensorboard package: pip install -e ".[tensorboard]" '
                "(or set train.tensorboard=false)"
            ) from None
        # purge_step: TensorBoard hides what an earlier writer logged from this step on (an
        # interrupted run's steps after its checkpoint), so a resumed run shows each step once.
        purge = None if resumed_at is None else resumed_at + 1
        self.writer = SummaryWriter(str(folder), purge_step=purge)

    def log_step(self, step: int, scalars: dict[str, float]) -> None:
        for name, value in scalars.items():
            self.writer.add_scalar(f"train/{name}", value, step)

    def log_epoch(self, epoch: int, step: int, metrics: dict) -> None:
        for name, value in metrics.items():
            if isinstance(value, list | dict):  # one number per rank, or per entry of a mix: epoch/<name>/<which>
                for which, each in value.items() if isinstance(value, dict) else enumerate(value):
                    if _number(each):
                        self.writer.add_scalar(f"epoch/{name}/{which}", each, step)
            elif _number(value):
                self.writer.add_scalar(f"epoch/{name}", value, step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


def _number(value) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _epoch_of(line: str) -> int | None:
    """The epoch of a line of ``metrics.jsonl`` (``None``: not one this project wrote whole)."""
    try:
        epoch = json.loads(line).get("epoch")
    except (ValueError, AttributeError):
        return None
    return epoch if isinstance(epoch, int) else None
