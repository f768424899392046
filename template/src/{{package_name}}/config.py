# torchfeed's file: `copier update` replaces it. Your model is model.py; your augmentations, loss and
# metric are task.py; your settings configs/default.yaml (README.md: "Which files are yours").
"""Configuration: one dataclass per section, read from YAML and ``section.key=value`` overrides.

    python -m <package> train --config configs/default.yaml train.epochs=5 loader.num_workers=4

The dataclasses are the only place defaults live, each key's meaning in the comment above its
field: ``python -m <package> config`` prints them all (:func:`as_yaml`, :func:`as_markdown`).
``configs/default.yaml`` is the user's: it sets the keys they choose. The ``data`` section joins
the common keys below with those of this project's source (``SourceConfig`` in
data/project_source.py), of its sample format (``FormatConfig`` in format_config.py) and of your
own sources (``SourceKeys`` in sources.py); ``model`` is ``ModelConfig`` in model.py. This module
imports no data code: none of the sources, the loader or the sample format's decoding.

OmegaConf merges the layers (dataclass defaults, then the YAML file, then the overrides) and
checks types; each section's ``__post_init__`` checks ranges. Unknown keys, wrong types and
bad values stop the command before any work, naming the key. Relative paths are relative to
the directory the command runs in (the project root).
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import json
import logging
import os
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Union

from omegaconf import OmegaConf
from omegaconf.errors import ConfigKeyError, OmegaConfBaseException

from . import data, project
from .data.project_source import SourceConfig
from .errors import ConfigError, require
from .format_config import FormatConfig
from .model import ModelConfig
from .sources import SourceKeys

log = logging.getLogger(__name__)

DEFAULT_CONFIG = Path("configs/default.yaml")
AUTO = "auto"


@dataclass
class MixEntry:
    """One entry of ``data.mix``: a data set and its weight (README.md: "Mixing data sets")."""

    # Where its data is, as data.root names it for its source.
    root: str = ""
    # Its share of the training samples, relative to the other entries' weights.
    weight: float = 1.0
    # The source that reads it ("" = data.source).
    source: str = ""
    # Its name in metrics and sample keys ("" = the last part of its root).
    name: str = ""
    # Read whole within an epoch: start again, reshuffled (true), or stop taking part until the next epoch (false).
    cycle: bool = True


@dataclass
class DataConfig(SourceKeys, FormatConfig, SourceConfig):
    """``data.*``: where samples come from (``SourceConfig``, ``SourceKeys``), what one is (``FormatConfig``), these."""

    # The source that reads data.root: this project's own, or one of yours named in sources.py.
    source: str = data.project_source.NAME
    # Unreadable or corrupt samples skipped (and logged) per process before the run stops.
    bad_sample_budget: int = 10
    # A cache written by `pack --to cache` to train from instead of data.root ("" = none).
    cache: str = ""
    # Data sets to train on together, instead of data.root: a list of {root, weight, source, name, cycle}.
    mix: list[MixEntry] = field(default_factory=list)
    # With data.mix: training samples per epoch over all ranks (0 = as data.mix_until says).
    epoch_samples: int = 0
    # With data.mix and no data.epoch_samples: an epoch ends when the first entry, or the last, has been read whole.
    mix_until: str = "last"

    def __post_init__(self) -> None:
        # A config file's "~/data": only a shell expands "~", and only on the command line.
        self.root, self.cache = os.path.expanduser(self.root), os.path.expanduser(self.cache)
        for entry in self.mix:
            entry.root = os.path.expanduser(entry.root)
        if not self.root and not self.mix:
            raise ConfigError("data.root is empty: set it to where the data is (data.root=PATH, or in the config file)")
        SourceConfig.__post_init__(self)
        FormatConfig.__post_init__(self)
        SourceKeys.__post_init__(self)
        names = data.registry()
        expected = f"one of: {', '.join(names)}; name a source of yours in sources.py"
        require("data.source", self.source, self.source in names, expected)
        require("data.bad_sample_budget", self.bad_sample_budget, self.bad_sample_budget >= 0, ">= 0")
        require("data.epoch_samples", self.epoch_samples, self.epoch_samples >= 0, ">= 0 (0 = as data.mix_until says)")
        require("data.mix_until", self.mix_until, self.mix_until in ("first", "last"), "first or last")
        require("data.mix", f"{len(self.mix)} entries", len(self.mix) <= 1000, "at most 1000 entries")
        for i, entry in enumerate(self.mix):
            require(f"data.mix[{i}].root", entry.root, bool(entry.root), "where the entry's data is")
            w = entry.weight
            require(f"data.mix[{i}].weight", w, 0 <= w < float("inf"), "a finite number >= 0")
            if entry.source:
                require(f"data.mix[{i}].source", entry.source, entry.source in names, expected)
        if self.mix and not any(entry.weight > 0 for entry in self.mix):
            raise ConfigError("data.mix: every weight is 0: give at least one entry a weight > 0")


def _auto_or(key: str, value, minimum: int) -> None:
    ok = value == AUTO if isinstance(value, str) else value >= minimum
    require(key, value, ok, f"'{AUTO}' or an int >= {minimum}")


def _auto_or_bool(key: str, value) -> None:
    require(key, value, isinstance(value, bool) or value == AUTO, f"'{AUTO}', true or false")


@dataclass
class LoaderConfig:
    """``loader.*``: the DataLoader arguments; ``auto`` takes what `bench` measured."""

    # Samples per batch per process (the global batch is this x world size); at least 2.
    batch_size: int = project.BATCH_SIZE
    # Worker processes; auto = the tuned value, else usable CPUs / processes per node.
    num_workers: Union[int, str] = AUTO  # noqa: UP007 (OmegaConf reads typing.Union, not int | str)
    # Batches each worker loads ahead; auto = the tuned value, else 2 (ignored without workers).
    prefetch_factor: Union[int, str] = AUTO  # noqa: UP007
    # Keep training workers alive between epochs (validation workers start for each evaluation);
    # auto = the tuned value, else true (ignored without workers).
    persistent_workers: Union[bool, str] = AUTO  # noqa: UP007
    # Page-locked host memory for faster host-to-GPU copies; auto = the tuned value, else on with CUDA.
    pin_memory: Union[bool, str] = AUTO  # noqa: UP007
    # Training workers reuse the shared memory of their batches (data/batch_pool.py, beyond torch's public
    # API); auto = on where `bench` measured it faster for this data and machine (configs/tuned.yaml), else off.
    batch_pool: Union[bool, str] = AUTO  # noqa: UP007
    # Drop the last incomplete training batch (evaluation never drops samples).
    drop_last: bool = True
    # Settings written by `bench`; used for the auto values while made for this data and machine.
    tuned: str = "configs/tuned.yaml"
    # Seconds the workers may send no batch before the run stops naming the loader (0 = wait forever).
    timeout_s: int = 600
    # How workers start: auto = $<PACKAGE>_START_METHOD when set, else forkserver where the system has one
    # (Linux, macOS), else spawn; never fork.
    start_method: str = AUTO

    def __post_init__(self) -> None:
        # A training batch of one sample breaks BatchNorm (and most models' statistics).
        require("loader.batch_size", self.batch_size, self.batch_size >= 2, ">= 2")
        _auto_or("loader.num_workers", self.num_workers, 0)
        _auto_or("loader.prefetch_factor", self.prefetch_factor, 1)
        _auto_or_bool("loader.persistent_workers", self.persistent_workers)
        _auto_or_bool("loader.pin_memory", self.pin_memory)
        _auto_or_bool("loader.batch_pool", self.batch_pool)
        require("loader.timeout_s", self.timeout_s, self.timeout_s >= 0, ">= 0")
        methods = (AUTO, "forkserver", "spawn")
        require("loader.start_method", self.start_method, self.start_method in methods, ", ".join(methods))


@dataclass
class TrainConfig:
    """``train.*``: the optimisation, checkpoints and where the run's files go."""

    # Passes over the training data.
    epochs: int = 3
    # Seeds model init, sampling order and augmentation: the same seed repeats a run.
    seed: int = 0
    # Metrics, checkpoint and bench reports go here.
    run_dir: str = "runs/default"
    # Optimizer steps between checkpoints (0 = only at the end of each epoch).
    checkpoint_every: int = 200
    # auto = continue from <run_dir>/checkpoint.pt when it exists; never; or a checkpoint path.
    resume: str = AUTO
    # Steps between progress updates (the host reads the loss from the device only then).
    log_every: int = 50
    # Also log to TensorBoard, in <run_dir>/tensorboard (pip install -e ".[tensorboard]"); metrics.jsonl always.
    tensorboard: bool = False
    # Stop each epoch after this many batches (0 = the whole epoch); for smoke runs.
    max_batches: int = 0
    # Mixed precision on a GPU (bf16 where native, else fp16 with loss scaling; compute.py); auto = on.
    amp: Union[bool, str] = AUTO  # noqa: UP007

    def __post_init__(self) -> None:
        self.run_dir = os.path.expanduser(self.run_dir)
        require(
            "train.run_dir", self.run_dir, bool(self.run_dir.strip()), "a folder for the run's files, e.g. runs/default"
        )
        require("train.epochs", self.epochs, self.epochs >= 1, ">= 1")
        require("train.checkpoint_every", self.checkpoint_every, self.checkpoint_every >= 0, ">= 0")
        require("train.log_every", self.log_every, self.log_every >= 1, ">= 1")
        require("train.max_batches", self.max_batches, self.max_batches >= 0, ">= 0")
        _auto_or_bool("train.amp", self.amp)


@dataclass
class OptimConfig:
    """``optim.*``: the optimizer and its learning-rate schedule (compute.py builds them)."""

    # adamw, or sgd (with Nesterov momentum).
    name: str = "adamw"
    # Peak learning rate: the schedule starts there.
    lr: float = 3e-3
    # Weight decay (decoupled from the gradient in AdamW).
    weight_decay: float = 0.05
    # SGD's momentum (AdamW ignores it).
    momentum: float = 0.9
    # cosine = decay to zero over the run; constant = optim.lr throughout.
    schedule: str = "cosine"

    def __post_init__(self) -> None:
        require("optim.name", self.name, self.name in OPTIMIZERS, " or ".join(OPTIMIZERS))
        require("optim.lr", self.lr, 0 < self.lr < float("inf"), "a finite number > 0")
        require("optim.weight_decay", self.weight_decay, self.weight_decay >= 0, ">= 0")
        require("optim.momentum", self.momentum, 0 <= self.momentum < 1, "0 <= momentum < 1")
        require("optim.schedule", self.schedule, self.schedule in SCHEDULES, " or ".join(SCHEDULES))


OPTIMIZERS = ("adamw", "sgd")
SCHEDULES = ("cosine", "constant")
# Keys that moved, and where to: an old config naming them still works, with a warning.
MOVED = {"train.lr": "optim.lr", "train.weight_decay": "optim.weight_decay"}


@dataclass
class DistConfig:
    """``dist.*``: the process group that ``launch`` (torchrun) starts."""

    # auto = nccl with CUDA, gloo on the CPU.
    backend: str = AUTO
    # Seconds a collective may wait before the run fails instead of hanging.
    timeout_s: int = 300

    def __post_init__(self) -> None:
        require("dist.backend", self.backend, self.backend in (AUTO, "nccl", "gloo"), "auto, nccl or gloo")
        require("dist.timeout_s", self.timeout_s, self.timeout_s >= 1, ">= 1")


@dataclass
class Config:
    data: DataConfig = field(default_factory=DataConfig)
    loader: LoaderConfig = field(default_factory=LoaderConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    dist: DistConfig = field(default_factory=DistConfig)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def key_comments(section_class: type) -> dict[str, str]:
    """Each field's meaning: the ``#`` comment lines right above it in its dataclass (or a base's).

    The dataclasses are where a key is documented, once: ``python -m <package> config`` prints
    every key with its value and this text (as YAML, or ``--markdown`` as a table).
    """
    comments: dict[str, str] = {}
    for klass in reversed(section_class.__mro__):  # a subclass's comment wins over its base's
        if not dataclasses.is_dataclass(klass):
            continue
        try:
            lines, _ = inspect.getsourcelines(klass)
        except (OSError, TypeError):
            continue
        for node in ast.parse(textwrap.dedent("".join(lines))).body[0].body:
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                above, row = [], node.lineno - 2
                while row >= 0 and lines[row].strip().startswith("#"):
                    above.insert(0, lines[row].strip().lstrip("#").strip())
                    row -= 1
                comments[node.target.id] = " ".join(above)
    return comments


def describe(cfg: Config) -> list[tuple[str, str, object, str]]:
    """``(section, key, value, meaning)`` for every key of ``cfg``, in the dataclasses' order."""
    rows = []
    for section in dataclasses.fields(cfg):
        values = getattr(cfg, section.name)
        comments = key_comments(type(values))
        for f in dataclasses.fields(values):
            rows.append((section.name, f.name, getattr(values, f.name), comments.get(f.name, "")))
    return rows


def as_yaml(cfg: Config) -> str:
    """Every key, as a YAML file that sets it to its value, each with its meaning as a comment above it."""
    out, current = [], None
    for section, key, value, meaning in describe(cfg):
        if section != current:
            out.append(f"{'' if current is None else chr(10)}{section}:")
            current = section
        if meaning:
            out += [f"  # {line}" for line in textwrap.wrap(meaning, 96)]
        out.append(f"  {key}: {json.dumps(value, default=dataclasses.asdict)}")
    return "\n".join(out) + "\n"


def as_markdown(cfg: Config) -> str:
    """Every key as a Markdown table: key, value, meaning."""
    out = ["| key | value | meaning |", "| --- | --- | --- |"]
    for section, key, value, meaning in describe(cfg):
        shown = json.dumps(value, default=dataclasses.asdict)
        out.append(f"| `{section}.{key}` | `{shown}` | {meaning.replace('|', chr(92) + '|')} |")
    return "\n".join(out) + "\n"


def load_config(path: str | os.PathLike | None = None, overrides=()) -> Config:
    """Build the config from the dataclass defaults, then a YAML file, then overrides.

    Args:
        path: YAML file; ``None`` reads ``configs/default.yaml`` when it exists.
        overrides: strings such as ``"train.epochs=5"`` or ``"optim.lr=1e-4"``, applied last.
    """
    if path is None and DEFAULT_CONFIG.is_file():
        path = DEFAULT_CONFIG
    conf = OmegaConf.structured(Config)
    if path is not None:
        conf = _merge(conf, _read_yaml(Path(path)), f"in {path}")
    for text in overrides:
        conf = _merge(conf, _parse_override(text), f"in override {text!r}")
    try:
        return OmegaConf.to_object(conf)  # each section's __post_init__ checks its ranges
    except OmegaConfBaseException as e:
        raise ConfigError(_explain(e, "")) from None


def _merge(conf, layer, where: str):
    for old, new in MOVED.items():  # an old key still works, once, with a warning naming its new home
        section, key = old.split(".")
        if key in (layer.get(section) or {}):
            value = layer[section].pop(key)
            new_section, new_key = new.split(".")
            if new_key in (layer.get(new_section) or {}):
                raise ConfigError(f"{old} and {new}{' ' + where if where else ''} name one setting: keep {new}")
            OmegaConf.update(layer, new, value, merge=True)
            log.warning("%s is now %s (%s): rename it there", old, new, where)
    try:
        return OmegaConf.merge(conf, layer)
    except OmegaConfBaseException as e:
        raise ConfigError(_explain(e, where)) from None
    except TypeError as e:  # a mapping where a list goes (data.mix), or the reverse
        raise ConfigError(
            f"{e}{' ' + where if where else ''}: data.mix is a list, [{{root: ..., weight: ...}}, ...]"
        ) from None


def _read_yaml(path: Path):
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist (expected a YAML file such as {DEFAULT_CONFIG})")
    try:
        tree = OmegaConf.load(path)
    except Exception as e:  # the YAML parser's errors carry the line and column
        text = path.read_text(encoding="utf-8", errors="replace").splitlines()
        tabs = [n for n, line in enumerate(text, 1) if "\t" in line[: len(line) - len(line.lstrip())]]
        if tabs:  # YAML indents with spaces only; its parser's error never says "tab"
            raise ConfigError(
                f"config file {path} indents line {tabs[0]} with a tab, which YAML does not allow: indent with spaces"
            ) from None
        said = " ".join(str(e).split())
        raise ConfigError(f"config file {path} is not valid YAML: {said}") from None
    if not OmegaConf.is_dict(tree):
        sections = ", ".join(f.name for f in dataclasses.fields(Config))
        raise ConfigError(f"config file {path} must hold a mapping of sections ({sections})")
    for section, keys in list(tree.items()):
        if keys is None:  # a section whose keys were all removed (or not yet written): nothing to set
            del tree[section]
        elif not OmegaConf.is_dict(keys):
            raise ConfigError(f"section {section} in {path} must be a mapping of key: value (got {keys!r})")
    return tree


def _parse_override(text: str):
    dotted = text.split("=", 1)[0]
    if "=" not in text or "." not in dotted or not all(dotted.split(".")):
        raise ConfigError(f"override {text!r} is not of the form section.key=value (e.g. train.epochs=5)")
    try:
        if text.endswith("="):  # `loader.tuned=` (what the shell makes of `loader.tuned=''`): the empty string
            return OmegaConf.create({dotted.split(".", 1)[0]: {dotted.split(".", 1)[1]: ""}})
        return OmegaConf.from_dotlist([text])
    except OmegaConfBaseException as e:
        raise ConfigError(f"override {text!r} cannot be read: {str(e).splitlines()[0]}") from None


def _explain(e: OmegaConfBaseException, where: str) -> str:
    """One line naming the key, the value and what is expected, from OmegaConf's error."""
    key = getattr(e, "full_key", None) or "?"
    where = f" {where}" if where else ""
    parent = getattr(e, "parent_node", None)
    entry_keys = [f.name for f in dataclasses.fields(MixEntry)]
    if isinstance(e, ConfigKeyError) and "." not in key and parent is not None and "root" in parent:
        return f"unknown key {key!r} in an entry of data.mix{where} (expected one of: {', '.join(entry_keys)})"
    if isinstance(e, ConfigKeyError):
        section = key.split(".")[0]
        known = [f.name for f in dataclasses.fields(Config)]
        if section not in known:
            return f"unknown config section {section!r}{where} (expected one of: {', '.join(known)})"
        keys = [f"{section}.{f.name}" for f in dataclasses.fields(getattr(Config(), section))]
        return f"unknown config key {key}{where} (expected one of: {', '.join(keys)})"
    if "." not in key and key in entry_keys and parent is not None:
        key = f"data.mix entry of root {parent.get('root')!r}: {key}"  # OmegaConf names no list index
    return f"{key}: {str(e).splitlines()[0]}{where}"
