# torchfeed's file: `copier update` replaces it. Your model is model.py; your augmentations, loss and
# metric are task.py; your settings configs/default.yaml (README.md: "Which files are yours").
"""``configs/tuned.yaml``: the loader settings `bench` chose, per data/machine fingerprint.

Loader keys left at ``auto`` take the tuned value while the fingerprint of the data and the
machine still matches; `train` re-runs a quick bench when none does.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

import torch
import yaml

from .. import dist
from .source import Source, data_settings

log = logging.getLogger(__name__)


def fingerprint(cfg, dataset) -> dict:
    """What the tuned settings depend on; `train` re-tunes when any of it changes."""
    data = data_settings(cfg)
    if "://" not in data["root"]:
        data["root"] = str(Path(data["root"]).resolve())
    return {
        "data": data,
        "source": dataset.fingerprint() if isinstance(dataset, Source) else type(dataset).__name__,
        "batch_size": cfg.loader.batch_size,
        "cpus": dist.usable_cpus(),
        "processes_per_node": dist.processes_per_node(),
        "torch": str(torch.__version__),
    }


def read_tuned(cfg, dataset) -> dict | None:
    """The ``loader`` settings in ``cfg.loader.tuned`` made for this data and machine, if any."""
    fp = fingerprint(cfg, dataset)
    for entry in _tuned_entries(cfg.loader.tuned):
        if entry.get("fingerprint") == fp:
            return entry.get("loader") or None
    return None


def with_tuned(cfg, dataset):
    """``cfg`` with each ``loader`` key left at ``auto`` set to its tuned value for this data and machine.

    Called once, before any loader is built (``build_loader`` reads no file): explicit values
    win, and without a matching entry the keys stay ``auto`` (the default rule).
    """
    tuned = read_tuned(cfg, dataset) or {}
    fields = {f.name for f in dataclasses.fields(cfg.loader)}
    chosen = {k: v for k, v in tuned.items() if k in fields and getattr(cfg.loader, k) == "auto"}
    if "num_workers" in chosen and isinstance(dataset, Source) and dataset.max_workers() is not None:
        # as for auto: no more workers than this rank's share of the data can keep busy
        chosen["num_workers"] = min(chosen["num_workers"], max(1, dataset.max_workers()))
    return dataclasses.replace(cfg, loader=dataclasses.replace(cfg.loader, **chosen)) if chosen else cfg


def _tuned_entries(path: str) -> list[dict]:
    """The entries of the tuned file; an unreadable one counts as none (`bench` then rewrites it)."""
    if not path or not Path(path).is_file():
        return []
    try:
        with open(path, encoding="utf-8") as f:
            entries = (yaml.safe_load(f) or {}).get("entries") or []
        if isinstance(entries, list) and all(isinstance(e, dict) for e in entries):
            return entries
    except (yaml.YAMLError, UnicodeDecodeError, AttributeError, OSError):
        pass
    log.warning("%s is not a tuned-settings file bench wrote: ignored (the next bench replaces it)", path)
    return []


def write_tuned(path: str, fp: dict, settings: dict, keep: int = 8) -> None:
    """Record ``settings`` for fingerprint ``fp``, keeping the entries of other set-ups.

    One file serves e.g. a 1-process and a 2-process run on the same data side by side.
    """
    entries = [e for e in _tuned_entries(path) if e.get("fingerprint") != fp]
    entries = [{"fingerprint": fp, "loader": settings}, *entries][:keep]
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    header = "# Written by `bench`: loader settings for keys left at `auto`, per data/machine fingerprint.\n"
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(header + yaml.safe_dump({"entries": entries}, sort_keys=False), encoding="utf-8")
    tmp.replace(path)
