# torchfeed's file: `copier update` replaces it. Your model is model.py; your augmentations, loss and
# metric are task.py; your settings configs/default.yaml; your own sources sources.py.
"""The data pipeline: the sources ``data.source`` selects from, and the loader factory.

    from <package>.data import build_dataset, build_loader, set_epoch
    train_loader = build_loader(build_dataset(cfg, "train"), cfg, "train")

The sources are this project's own (data/project_source.py names it) and yours (sources.py):
``data.source`` picks one by name. With ``data.cache`` set, ``build_dataset`` reads the cache
that ``pack --to cache`` wrote from that source (data/cache.py), after checking that it still
matches the source.

This module imports no data code itself (the config reads the sources' names here): a source's
module is imported when it is used, and ``build_loader`` and ``set_epoch``
come from data/loader.py on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from .. import sources as yours
from ..errors import UserError
from . import project_source

if TYPE_CHECKING:
    from .source import Source

_LOADER = ("build_loader", "set_epoch")


def registry() -> dict[str, str]:
    """Every source ``data.source`` may name: ``name -> "module:Class"`` (this project's, then yours)."""
    return {project_source.NAME: project_source.CLASS, **yours.SOURCES}


def source_class(name: str) -> type[Source]:
    """The class of the source named ``name`` (``data.source``), its module imported now."""
    from .source import Source

    known = registry()
    if name not in known:
        raise UserError(f"data.source={name!r} is no source of this project (expected one of: {', '.join(known)})")
    target = known[name]
    module_name, _, attribute = target.partition(":")
    where = f"data.source={name} names {target!r} (sources.py)"
    try:
        module = importlib.import_module(module_name, package=__package__.rpartition(".")[0])
    except ModuleNotFoundError as e:  # the module, or one it imports
        raise UserError(f"{where} ('module:Class', e.g. '.csv_source:CSVSource'); importing it failed: {e}") from None
    found = getattr(module, attribute, None)
    if not (isinstance(found, type) and issubclass(found, Source)):
        raise UserError(f"{where}, which is not a subclass of data.source.Source in {module.__name__}")
    return found


def build_dataset(cfg, split: str, task=None, *, rank: int | None = None, world_size: int | None = None) -> Source:
    """The dataset of ``split`` ("train" | "val") for this process (or the given rank).

    Args:
        cfg (Config): the run's config; ``data.source`` names the source.
        split (str): ``"train"`` or ``"val"``.
        task (Task, optional): decodes and transforms the samples (``task.Task(cfg.data, split)`` when
            not given); the training loop then takes the dataset's task for its loss and metric.
        rank, world_size (int, optional): default to the running process group's.

    The entries of ``data.mix`` mixed by weight when it is set (data/mix.py); else the cache at ``data.cache``
    when that is set, else the source at ``data.root``.
    """
    if cfg.data.mix:  # several data sets, by weight (data/mix.py)
        from .mix import open_mix

        return open_mix(cfg, split, task, rank=rank, world_size=world_size)
    cls = source_class(cfg.data.source)
    if cfg.data.cache:
        from .cache import open_cache

        return open_cache(cfg, split, cls, task, rank=rank, world_size=world_size)
    return cls.open(cfg, split, task, rank=rank, world_size=world_size)


def commands() -> dict[str, str]:
    """The commands this project's source brings to ``python -m <package>`` (besides bench, train and launch):
    name -> its line in ``--help``."""
    return {name: text for name, (_, text) in project_source.COMMANDS.items()}


def command(name: str):
    """The module of the command ``name`` (``add_arguments(parser)`` and ``run(cfg, args)``), imported now."""
    return importlib.import_module(f".{project_source.COMMANDS[name][0]}", __name__)


def __getattr__(name: str):
    if name in _LOADER:  # the loader factory, imported on first use
        from . import loader

        return getattr(loader, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["build_dataset", "build_loader", "command", "commands", "registry", "set_epoch", "source_class"]
