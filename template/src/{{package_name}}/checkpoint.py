# torchfeed's file: `copier update` replaces it. Your model is model.py; your augmentations, loss and
# metric are task.py; your settings configs/default.yaml (README.md: "Which files are yours").
"""Atomic, resumable checkpoints: what a run saves, and how a resumed run continues.

A checkpoint is one dict of named ``state_dict``s (model, optimizer, every rank's train
loader and RNGs) plus where the run stands (:class:`Progress`) and the config. Only rank 0
writes it, to a temporary file that then replaces the old one, so a crash mid-write never
leaves a truncated ``checkpoint.pt``. It is read back with ``weights_only=True``: loading a
checkpoint runs no pickled code, and one that lacks a part is refused naming it. A write that
finds the disk full is one error naming the file, keeping the previous checkpoint; a temporary
file left by a run killed mid-write is removed when the next run in that folder starts.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import random
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch

from . import dist
from .data.source import Source, data_settings
from .errors import DiskFull, UserError, held_alone, is_disk_full

log = logging.getLogger(__name__)

CHECKPOINT = "checkpoint.pt"
FORMAT = 2  # v0.1.0 of the template wrote checkpoints without a "format" key


class CheckpointError(UserError):
    """A checkpoint that this project cannot resume from."""


# The parts of a checkpoint, and what each is.
PARTS = {
    "model": dict,
    "optimizer": dict,
    "progress": dict,
    "layout": dict,
    "loader": list,
    "rng": list,
    "config": dict,
}


class _Recorded:
    """A file that remembers the error of a failed write (torch.save reports it as "unexpected pos")."""

    def __init__(self, f) -> None:
        self.f, self.error = f, None

    def write(self, data) -> int:
        try:
            return self.f.write(data)
        except OSError as e:
            self.error = e
            raise

    def flush(self) -> None:
        self.f.flush()


def save_checkpoint(path: str | os.PathLike, state: dict) -> None:
    """Write ``state`` to ``path`` atomically (temporary file, fsync, ``os.replace``).

    A failed write removes its temporary file; for want of space it is :class:`DiskFull`.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")  # a writer's own: two never share one
    recorded = None
    try:
        with open(tmp, "wb") as f:
            recorded = _Recorded(f)
            torch.save({"format": FORMAT, **state}, recorded)
            f.flush()
            os.fsync(f.fileno())
    except BaseException as e:
        with contextlib.suppress(OSError):
            tmp.unlink()
        cause = recorded.error if recorded is not None and recorded.error is not None else e
        if not is_disk_full(cause):
            raise
        then = (
            f"the previous checkpoint {path} is kept: free some space and run the same command again, which resumes "
            "from it"
            if path.is_file()
            else "no checkpoint was written before this one: free some space and run again, which starts over"
        )
        raise DiskFull(
            f"{cause.strerror.lower()} writing the checkpoint {tmp} ({_free(path.parent)}); {then}"
        ) from None
    os.replace(tmp, path)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:  # the rename itself survives a power loss once the directory is on disk
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def _free(folder: Path) -> str:
    try:
        usage = os.statvfs(folder)
        return f"{usage.f_bavail * usage.f_frsize / 2**20:.0f} MB free there"
    except OSError:
        return "free space unknown"


def remove_temporaries(run_dir: Path) -> None:
    """Remove the temporary checkpoint files of runs killed mid-write (the caller holds run_dir's lock)."""
    for tmp in run_dir.glob(f".{CHECKPOINT}.*.tmp"):
        log.info("removing %s, left by a run that stopped while writing a checkpoint", tmp)
        with contextlib.suppress(OSError):
            tmp.unlink()


def load_checkpoint(path: str | os.PathLike) -> dict:
    """Load a checkpoint onto the CPU, refusing pickled code, missing parts and checkpoints of another format."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # empty, truncated, pickled code, or not a checkpoint at all
        said = " ".join(str(e).split())
        unpickler = said.partition("WeightsUnpickler error: ")[2]
        if unpickler.startswith(("Unsupported global", "Unsupported class")):  # a pickled object, not a tensor
            raise CheckpointError(
                f"{path} holds pickled Python objects, which no checkpoint of this project does ({_sentence(unpickler)}"
                "): loading it could run code, so it is not loaded; pass a checkpoint this project wrote, or "
                "train.resume=never to start a new run"
            ) from None
        raise CheckpointError(
            f"{path} is not a readable checkpoint ({type(e).__name__}: {_sentence(said) or 'no detail'}): move it "
            "away, or pass train.resume=never to start a new run"
        ) from None
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        written_by = "torchfeed v0.1.0" if isinstance(state, dict) and "batch_in_epoch" in state else "another version"
        raise CheckpointError(
            f"{path} was written by {written_by}, whose resume state this project cannot read: start a new run "
            f"with train.resume=never (or another train.run_dir), or finish that run with the project's old version"
        )
    wrong = [
        f"{k} ({type(state[k]).__name__})" for k, kind in PARTS.items() if k in state and not isinstance(state[k], kind)
    ]
    missing = sorted(k for k in PARTS if k not in state) + wrong
    unknown = set(state.get("progress", {})) - {f.name for f in dataclasses.fields(Progress)}
    if missing or unknown or not isinstance(state.get("progress"), dict):
        what = ", ".join(missing) if missing else f"progress keys {sorted(unknown)}"
        raise CheckpointError(
            f"{path} lacks or garbles what a checkpoint of this project holds ({what}; expected "
            f"{', '.join(PARTS)}): it was not written by this project's train, or was edited; pass "
            "train.resume=never to start a new run"
        )
    return state


def _sentence(text: str, most: int = 240) -> str:
    """The first sentence of ``text``, or its first ``most`` characters ending in "...".

    >>> _sentence("Unsupported global: GLOBAL builtins.exec was not allowed. Check the docs.")
    'Unsupported global: GLOBAL builtins.exec was not allowed'
    """
    first = text.split(". ", 1)[0].rstrip(".")
    return first if len(first) <= most else first[: first.rfind(" ", 0, most)] + "..."


@contextlib.contextmanager
def run_dir_lock(run_dir: Path) -> Iterator[None]:
    """Hold ``run_dir/.lock`` while a run writes there: a second run in the same folder stops at once."""
    run_dir.mkdir(parents=True, exist_ok=True)
    busy = f"{run_dir} is in use by another train"
    with held_alone(run_dir / ".lock", busy, "wait for it, or pass another train.run_dir"):
        remove_temporaries(run_dir)
        yield


def resume_path(resume: str, run_dir: str | os.PathLike) -> Path | None:
    """The checkpoint ``train.resume`` names: ``auto`` (if present), ``never``, or a path."""
    if resume == "never":
        if (Path(run_dir) / CHECKPOINT).is_file() and dist.is_main_process():
            log.warning(
                "train.resume=never: starting over in %s, whose checkpoint and metrics this run replaces", run_dir
            )
        return None
    if resume == "auto":
        path = Path(run_dir) / CHECKPOINT
        return path if path.is_file() else None
    path = Path(resume)
    if not path.is_file():
        raise CheckpointError(f"train.resume={resume} does not exist (expected auto, never or a checkpoint path)")
    return path


def rng_state(device: torch.device) -> dict:
    """This process's random generators: Python, NumPy, torch, and the device's own."""
    kind, key, pos, has_gauss, gauss = np.random.get_state()  # as tensors and numbers: weights_only loads them
    numpy = (kind, torch.from_numpy(key.astype(np.int64)), pos, has_gauss, gauss)
    state = {"python": random.getstate(), "numpy": numpy, "torch": torch.get_rng_state()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def set_rng_state(state: dict, device: torch.device) -> None:
    random.setstate(state["python"])
    kind, key, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state((kind, key.numpy().astype(np.uint32), pos, has_gauss, gauss))
    torch.set_rng_state(state["torch"])
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], device)


@dataclasses.dataclass
class Progress:
    """Where a run stands: what a checkpoint records and a resumed run continues from."""

    epoch: int = 0  # the epoch running, or the next one between epochs
    batch: int = 0  # batches of that epoch already trained
    step: int = 0  # optimizer steps since the run began
    total_steps: int | None = None  # the learning-rate schedule's length (None: not known yet)
    epoch_batches: int | None = None  # a source that cannot count: the batches of its last whole epoch
    # The running epoch's sums over all ranks before the checkpoint (loss x samples, samples, seconds,
    # seconds waiting for data): a resumed epoch's metrics cover all of it, not only its part after the resume.
    partial: dict | None = None


def layout(cfg, loader) -> dict:
    """What a position inside an epoch depends on: a resumed run continues it only if all match.

    The world and the loader's batching, the seed (orders and shuffle blocks), the data keys,
    and what the source knows of its data (e.g. its row count).
    """
    return {
        "world_size": dist.get_world_size(),
        "batch_size": cfg.loader.batch_size,
        "num_workers": loader.num_workers,
        "drop_last": cfg.loader.drop_last,
        "seed": cfg.train.seed,
        "data": data_settings(cfg),
        "source": loader.dataset.fingerprint() if isinstance(loader.dataset, Source) else None,
    }


def save(
    cfg,
    run_dir: Path,
    model,
    optimizer,
    loader,
    budget,
    device,
    progress: Progress,
    mid_epoch: bool,
    sums: dict | None = None,
) -> None:
    """Write the checkpoint (rank 0); every rank hands in its loader position, RNGs, the bad samples it met
    (``budget``) and (mid-epoch) its epoch's sums so far (``loss``, ``samples``, ``seconds``, ``wait_s``)."""
    mine = {"loader": loader.state_dict() if mid_epoch else None, "rng": rng_state(device), "sums": sums}
    mine["bad"] = budget.state_dict()
    ranks = dist.all_gather_object(mine)  # a collective at checkpoints only
    if dist.is_main_process():
        partial = None
        if mid_epoch and sums is not None:
            every = [r["sums"] for r in ranks]
            partial = {k: sum(r[k] for r in every) for k in ("loss", "samples", "wait_s")}
            partial["seconds"] = max(r["seconds"] for r in every)  # the ranks ran side by side
            partial["wait_by_rank"] = [r["wait_s"] for r in every]  # each rank's own, to go on from
            if every[0].get("entries") is not None:  # a mix's samples of each entry (data/mix.py)
                partial["entries"] = [sum(c) for c in zip(*(r["entries"] for r in every), strict=True)]
        state = {
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "progress": dataclasses.asdict(progress) | {"partial": partial},
            "layout": layout(cfg, loader),
            "loader": [r["loader"] for r in ranks],
            "rng": [r["rng"] for r in ranks],
            "bad": [r["bad"] for r in ranks],
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


def resume(saved: dict, cfg, model, optimizer, loader, budget, device) -> Progress:
    """Load the model, optimizer, this rank's RNGs, bad samples and loader position; returns where to continue."""
    try:
        model.load_state_dict(saved["model"])
    except RuntimeError as e:
        raise UserError(
            f"{saved['path']} holds weights of another model ({' '.join(str(e).split())[:200]}): start a new run "
            "with train.resume=never (or another train.run_dir)"
        ) from None
    was = saved.get("config", {}).get("optim", {}).get("name", "adamw")  # before optim.*, always AdamW
    if was != cfg.optim.name:
        raise UserError(
            f"{saved['path']} holds the state of a {was} optimizer, and optim.name={cfg.optim.name}: its moments "
            f"cannot carry over; pass optim.name={was} to continue, or train.resume=never to start a new run"
        )
    optimizer.load_state_dict(saved["optimizer"])
    progress = Progress(**saved["progress"])
    rank, world_size = dist.get_rank(), dist.get_world_size()
    if len(saved["rng"]) == world_size:
        set_rng_state(saved["rng"][rank], device)
    if len(saved.get("bad") or []) == world_size:  # the bad samples this rank met (checkpoints since 0.4 hold them)
        budget.load_state_dict(saved["bad"][rank])
    if progress.batch:
        now = layout(cfg, loader)
        if isinstance(now.get("data"), dict) and isinstance(saved["layout"].get("data"), dict):
            # a data key a later release added (data.source) did not move the position: compare those saved
            now["data"] = {k: now["data"].get(k) for k in saved["layout"]["data"]}
        changed = {k: (v, now.get(k)) for k, v in saved["layout"].items() if now.get(k) != v}
        if changed:
            what = ", ".join(f"{k} {old} -> {new}" for k, (old, new) in changed.items())
            log.warning("%s since the checkpoint: epoch %d restarts from its beginning", what, progress.epoch)
            progress.batch, progress.partial = 0, None
        else:
            loader.load_state_dict(saved["loader"][rank])
    changed = config_changes(saved.get("config", {}), cfg.to_dict())
    if changed:
        log.warning("changed since the checkpoint, and used from here on: %s", ", ".join(changed))
    where = (saved["path"], progress.epoch, progress.batch, progress.step)
    log.info("resumed from %s at epoch %d, batch %d, step %d", *where)
    return progress


def config_changes(saved: dict, now: dict) -> list[str]:
    """``"section.key old -> new"`` for each config value that differs from the checkpoint's.

    >>> config_changes({"optim": {"lr": 0.1, "name": "sgd"}}, {"optim": {"lr": 0.01, "name": "sgd"}})
    ['optim.lr 0.1 -> 0.01']
    """
    return [
        f"{section}.{key} {saved[section][key]} -> {value}"
        for section, values in now.items()
        for key, value in values.items()
        if key in saved.get(section, {}) and saved[section][key] != value
    ]
