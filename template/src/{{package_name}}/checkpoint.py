"""Atomic, resumable checkpoints.

A checkpoint is one dict of named ``state_dict``s plus epoch, step, config and RNG state.
Only rank 0 writes it, to a temporary file that then replaces the old one, so a crash
mid-write never leaves a truncated ``checkpoint.pt``.
"""

from __future__ import annotations

import os
import random
from pathlib import Path

import torch

CHECKPOINT = "checkpoint.pt"


def save_checkpoint(path: str | os.PathLike, state: dict) -> None:
    """Write ``state`` to ``path`` atomically (temporary file, fsync, ``os.replace``)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:  # the rename itself survives a power loss once the directory is on disk
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def load_checkpoint(path: str | os.PathLike) -> dict:
    """Load a checkpoint onto the CPU, refusing pickled code (``weights_only=True``)."""
    return torch.load(path, map_location="cpu", weights_only=True)


def resume_path(resume: str, run_dir: str | os.PathLike) -> Path | None:
    """The checkpoint ``train.resume`` names: ``auto`` (if present), ``never``, or a path."""
    if resume == "never":
        return None
    if resume == "auto":
        path = Path(run_dir) / CHECKPOINT
        return path if path.is_file() else None
    path = Path(resume)
    if not path.is_file():
        raise FileNotFoundError(f"train.resume={resume} does not exist (expected auto, never or a checkpoint path)")
    return path


def rng_state() -> dict:
    state = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
