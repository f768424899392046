"""Configuration: one dataclass per concern, read from YAML and ``section.key=value`` overrides.

    python -m <package> train --config configs/default.yaml train.epochs=5 loader.num_workers=4

Types are checked and unknown keys refused before any work starts, with the key named.
Relative paths are relative to the directory the command runs in (the project root).
"""

from __future__ import annotations

import dataclasses
import os
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Union

import yaml

from . import project

DEFAULT_CONFIG = Path("configs/default.yaml")


class ConfigError(ValueError):
    """A config file or override names an unknown key or holds a bad value."""


def _field(default: Any, check=None, expect: str = ""):
    return field(default=default, metadata={"check": check, "expect": expect})


def _positive(v) -> bool:
    return v > 0


def _non_negative(v) -> bool:
    return v >= 0


def _auto_or(check):
    return lambda v: v == "auto" or check(v)


DEFAULT_ROOT = {
    "folder": "data/sample",
    "stream": "http://127.0.0.1:8765/samples" if project.STREAM_BACKEND == "http" else "data/sample.sqlite",
    "shards": "data/shards",
}


@dataclass
class DataConfig:
    # Where the data is: the folder with train/ and val/, the SQLite file, the HTTP URL, or the shards folder.
    root: str = DEFAULT_ROOT[project.DATA_SOURCE]
    # Images: side of the square crop fed to the model.
    image_size: int = _field(64, lambda v: v >= 8, ">= 8")
    # Sequences: longer texts are truncated to this many byte tokens.
    max_len: int = _field(256, _positive, ">= 1")
    # Unreadable or corrupt samples skipped (and logged) per process before the run stops.
    bad_sample_budget: int = _field(10, _non_negative, ">= 0")
    # Classes; 0 = infer (folder: class folders; sqlite: largest label + 1; shards: _index.json).
    num_classes: int = _field(4 if project.STREAM_BACKEND == "http" else 0, _non_negative, ">= 0")
    # Streams: end each training epoch after this many samples over all ranks (0 = when exhausted).
    samples_per_epoch: int = _field(0, _non_negative, ">= 0")
    # Streams and shards: samples in each worker's approximate shuffle buffer (1 = no shuffling).
    shuffle_buffer: int = _field(1000, _positive, ">= 1")
    # HTTP streams: rows per request, retries of a transient failure, seconds per request.
    http_page_size: int = _field(256, _positive, ">= 1")
    http_retries: int = _field(5, _non_negative, ">= 0")
    http_timeout_s: float = _field(30.0, _positive, "> 0")


@dataclass
class LoaderConfig:
    # Samples per batch per process (the global batch is this x world size).
    batch_size: int = _field(project.BATCH_SIZE, _positive, ">= 1")
    # Worker processes; auto = the tuned value, else usable CPUs / local world size.
    num_workers: int | Literal["auto"] = _field("auto", _auto_or(_non_negative), "'auto' or an int >= 0")
    # Batches each worker loads ahead; auto = tuned value, else 2 (ignored without workers).
    prefetch_factor: int | Literal["auto"] = _field("auto", _auto_or(_positive), "'auto' or an int >= 1")
    # Keep workers alive between epochs; auto = tuned value, else on (ignored without workers).
    persistent_workers: bool | Literal["auto"] = "auto"
    # Page-locked host memory for faster host-to-GPU copies; auto = on when CUDA is used.
    pin_memory: bool | Literal["auto"] = "auto"
    # Drop the last incomplete training batch (evaluation never drops samples).
    drop_last: bool = True
    # Settings written by `bench`; used for the `auto` values when made for this data/machine.
    tuned: str = "configs/tuned.yaml"


@dataclass
class TrainConfig:
    epochs: int = _field(3, _positive, ">= 1")
    # Peak learning rate of AdamW; a cosine schedule decays it to zero.
    lr: float = _field(3e-3, _positive, "> 0")
    weight_decay: float = _field(0.05, _non_negative, ">= 0")
    # Seeds model init, sampling order and augmentation; the same seed repeats a run.
    seed: int = 0
    # Metrics, checkpoint and bench reports go here.
    run_dir: str = "runs/default"
    # Optimizer steps between checkpoints (0 = only at the end of each epoch).
    checkpoint_every: int = _field(200, _non_negative, ">= 0")
    # auto = continue from <run_dir>/checkpoint.pt when it exists; never; or a checkpoint path.
    resume: str = "auto"
    # Stop each epoch after this many batches (0 = the whole epoch); for smoke runs.
    max_batches: int = _field(0, _non_negative, ">= 0")
    # bf16 autocast on CUDA; auto = on when training on a GPU.
    amp: bool | Literal["auto"] = "auto"


@dataclass
class DistConfig:
    # auto = nccl with CUDA, gloo on the CPU.
    backend: str = _field("auto", lambda v: v in ("auto", "nccl", "gloo"), "auto, nccl or gloo")
    # Seconds a collective may wait before the run fails instead of hanging.
    timeout_s: int = _field(1800, _positive, ">= 1")


@dataclass
class Config:
    data: DataConfig = field(default_factory=DataConfig)
    loader: LoaderConfig = field(default_factory=LoaderConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    dist: DistConfig = field(default_factory=DistConfig)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def _type_ok(value: Any, hint: Any) -> bool:
    origin = typing.get_origin(hint)
    if origin in (Union, types.UnionType):
        return any(_type_ok(value, arg) for arg in typing.get_args(hint))
    if origin is Literal:
        return value in typing.get_args(hint)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, hint)


def _describe(hint: Any) -> str:
    origin = typing.get_origin(hint)
    if origin in (Union, types.UnionType):
        return " or ".join(_describe(arg) for arg in typing.get_args(hint))
    if origin is Literal:
        return " or ".join(repr(a) for a in typing.get_args(hint))
    return hint.__name__


def _set(section_obj: Any, section: str, key: str, value: Any) -> None:
    fields = {f.name: f for f in dataclasses.fields(section_obj)}
    if key not in fields:
        raise ConfigError(
            f"unknown config key {section}.{key} (expected one of: " + ", ".join(f"{section}.{k}" for k in fields) + ")"
        )
    f = fields[key]
    hint = typing.get_type_hints(type(section_obj))[key]
    if not _type_ok(value, hint):
        raise ConfigError(f"{section}.{key}={value!r} has type {type(value).__name__} (expected {_describe(hint)})")
    if hint is float:
        value = float(value)
    check = f.metadata.get("check")
    if check is not None and not check(value):
        raise ConfigError(f"{section}.{key}={value!r} is out of range (expected {f.metadata['expect']})")
    setattr(section_obj, key, value)


def _apply(cfg: Config, tree: dict, origin: str) -> None:
    if not isinstance(tree, dict):
        raise ConfigError(f"{origin} must hold a mapping of sections (data, loader, train, dist)")
    sections = {f.name for f in dataclasses.fields(cfg)}
    for section, values in tree.items():
        if section not in sections:
            raise ConfigError(
                f"unknown config section {section!r} in {origin} (expected one of: {', '.join(sorted(sections))})"
            )
        if values is None:
            continue
        if not isinstance(values, dict):
            raise ConfigError(f"section {section!r} in {origin} must be a mapping of key: value")
        for key, value in values.items():
            _set(getattr(cfg, section), section, key, value)


def parse_override(text: str) -> tuple[str, str, Any]:
    """Split ``section.key=value`` into its parts; the value is read as YAML.

    >>> parse_override("loader.num_workers=4")
    ('loader', 'num_workers', 4)
    """
    if "=" not in text or "." not in text.split("=", 1)[0]:
        raise ConfigError(f"override {text!r} is not of the form section.key=value (e.g. train.epochs=5)")
    dotted, raw = text.split("=", 1)
    section, key = dotted.strip().split(".", 1)
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as e:
        raise ConfigError(f"override {text!r}: the value is not valid YAML ({e})") from None
    return section, key, value


def load_config(path: str | os.PathLike | None = None, overrides=()) -> Config:
    """Build the config from defaults, then a YAML file, then ``section.key=value`` overrides.

    Args:
        path: YAML file; ``None`` reads ``configs/default.yaml`` when it exists.
        overrides: strings such as ``"train.epochs=5"``, applied last.
    """
    cfg = Config()
    if path is None and DEFAULT_CONFIG.exists():
        path = DEFAULT_CONFIG
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"config file {path} does not exist")
        with open(path, encoding="utf-8") as f:
            try:
                tree = yaml.safe_load(f) or {}
            except yaml.YAMLError as e:
                raise ConfigError(f"config file {path} is not valid YAML: {e}") from None
        _apply(cfg, tree, str(path))
    for text in overrides:
        section, key, value = parse_override(text)
        _apply(cfg, {section: {key: value}}, f"override {text!r}")
    return cfg
