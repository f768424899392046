"""Atomic, resumable checkpoints.

A checkpoint is one dict of named ``state_dict``s (model, optimizer, every rank's train
loader and RNGs) plus epoch, step and config. Only rank 0 writes it, to a temporary file that
then replaces the old one, so a crash mid-write never leaves a truncated ``checkpoint.pt``.
It is read back with ``weights_only=True``: loading a checkpoint runs no pickled code.
"""

from __future__ import annotations

import os
import random
from pathlib import Path

import numpy as np
import torch

from .errors import UserError

CHECKPOINT = "checkpoint.pt"
FORMAT = 2  # v0.1.0 of the template wrote checkpoints without a "format" key


class CheckpointError(UserError):
    """A checkpoint that this project cannot resume from."""


def save_checkpoint(path: str | os.PathLike, state: dict) -> None:
    """Write ``state`` to ``path`` atomically (temporary file, fsync, ``os.replace``)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as f:
        torch.save({"format": FORMAT, **state}, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:  # the rename itself survives a power loss once the directory is on disk
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def load_checkpoint(path: str | os.PathLike) -> dict:
    """Load a checkpoint onto the CPU, refusing pickled code and checkpoints of another format."""
    state = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        written_by = "torchfeed v0.1.0" if isinstance(state, dict) and "batch_in_epoch" in state else "another version"
        raise CheckpointError(
            f"{path} was written by {written_by}, whose resume state this project cannot read: start a new run "
            f"with train.resume=never (or another train.run_dir), or finish that run with the project's old version"
        )
    return state


def resume_path(resume: str, run_dir: str | os.PathLike) -> Path | None:
    """The checkpoint ``train.resume`` names: ``auto`` (if present), ``never``, or a path."""
    if resume == "never":
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
