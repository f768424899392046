# torchfeed's file: `copier update` replaces it. Your model is model.py; your augmentations, loss and
# metric are task.py; your settings configs/default.yaml (README.md: "Which files are yours").
"""The loaders' settings, resolved once, and ``configs/tuned.yaml``, where `bench` keeps what it chose.

    settings = loader_settings(cfg, {"train": train_set, "val": val_set}, saved)
    train_loader = build_loader(train_set, cfg, "train", settings["train"])

A ``loader`` key left at ``auto`` takes bench's value for this data and machine (an entry of
``configs/tuned.yaml`` whose fingerprint matches), else the default rule; `train` runs a quick
bench first when no entry matches.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any

import torch
import yaml
from torch.utils.data import IterableDataset

from .. import dist, project
from .loader import plan_shm, shm_space
from .source import Source, data_settings

log = logging.getLogger(__name__)
AUTO = "auto"
KEYS = ("num_workers", "prefetch_factor", "persistent_workers", "pin_memory", "batch_pool")


@dataclasses.dataclass
class LoaderSettings:
    """What `bench` tunes, resolved to values: four of DataLoader's arguments, and ``batch_pool``
    (data/batch_pool.py: workers reuse the shared memory of their batches)."""

    num_workers: int = 0
    prefetch_factor: int = 2
    persistent_workers: bool = True
    pin_memory: bool = False
    batch_pool: bool = False
    pool_blocks: int = 0  # the blocks a worker's batch pool may keep: what fits in /dev/shm (0: no pool)


def loader_settings(
    cfg, datasets: dict[str, Any], saved: dict | None = None, processes: int | None = None, plan: bool = True
) -> dict[str, LoaderSettings]:
    """Each loader's settings, the only place they are resolved; before any loader is built.

    A ``loader`` key set in the config is used as it is. One left at ``auto`` takes, in order: a
    mid-epoch checkpoint's worker count (``saved``: its position is per worker), bench's value in
    ``configs/tuned.yaml`` while its fingerprint matches this data and machine, else the default
    rule: the usable CPUs over this node's training processes (and no more than the source can
    feed), prefetch 2, persistent workers, pinned memory with a GPU, no batch pool. Then what the
    loaders need of /dev/shm is held against what is free there (data/loader.py: ``plan_shm``),
    which sizes the batch pool, or stops with one line.

    Args:
        cfg (Config): the run's config.
        datasets (dict): ``{split: dataset}`` of the loaders that run side by side.
        saved (dict, optional): the checkpoint the run resumes from.
        processes (int, optional): the training processes of this node (default: ``dist.processes_per_node()``).
        plan (bool): hold them against /dev/shm (False: the settings alone, as ``bench`` checks each of its own).
    """
    out, processes = {}, processes or dist.processes_per_node()
    most = max(1, dist.usable_cpus() // processes)
    for split, dataset in datasets.items():
        given = {k: getattr(cfg.loader, k) for k in KEYS}
        chosen = {k: v for k, v in given.items() if v != AUTO}
        if split == "train" and saved is not None and any(saved["loader"]) and "num_workers" not in chosen:
            chosen["num_workers"] = saved["layout"]["num_workers"]
        tuned = tuned_settings(cfg, dataset) or {}
        chosen |= {k: tuned[k] for k in KEYS if k in tuned and k not in chosen}
        feeds = dataset.max_workers() if isinstance(dataset, Source) else None
        default = {"num_workers": most if feeds is None else max(1, min(most, feeds)), "prefetch_factor": 2}
        default |= {"persistent_workers": True, "batch_pool": False}
        default["pin_memory"] = torch.cuda.is_available() and project.NUM_GPUS > 0
        settings = LoaderSettings(**(default | chosen))
        if given["num_workers"] == AUTO and feeds is not None:  # an explicit count is checked by the source instead
            settings.num_workers = min(settings.num_workers, max(1, feeds))
        if not isinstance(dataset, IterableDataset):
            settings.num_workers = min(settings.num_workers, len(dataset))
        out[split] = settings
    if plan:
        plan_shm(datasets, out, cfg.loader.batch_size, processes)
    return out


def fingerprint(cfg, dataset) -> dict:
    """What tuned settings depend on: the data and its batch size, this machine; `train` re-tunes when it changes."""
    data = data_settings(cfg)
    if "://" not in data["root"]:
        data["root"] = str(Path(data["root"]).resolve())
    shm = shm_space()
    return {
        "data": data,
        "source": dataset.fingerprint() if isinstance(dataset, Source) else type(dataset).__name__,
        "batch_size": cfg.loader.batch_size,
        "cpus": dist.usable_cpus(),
        "processes_per_node": dist.processes_per_node(),
        "shm_mb": None if shm is None else round(shm[0] / 2**20),  # /dev/shm caps the settings
        "torch": str(torch.__version__),
    }


def tuned_settings(cfg, dataset) -> dict | None:
    """The ``loader`` settings bench wrote for this data and machine (``None``: no entry matches)."""
    fp = fingerprint(cfg, dataset)
    return next((e.get("loader") or None for e in tuned_entries(cfg.loader.tuned) if e.get("fingerprint") == fp), None)


def tuned_entries(path: str) -> list[dict]:
    """The entries of the tuned file; an unreadable one counts as none (`bench` then rewrites it)."""
    if not path or not Path(path).is_file():
        return []
    try:
        entries = (yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}).get("entries") or []
        if isinstance(entries, list) and all(isinstance(e, dict) for e in entries):
            return entries
    except (yaml.YAMLError, UnicodeDecodeError, AttributeError, OSError):
        pass
    log.warning("%s is not a tuned-settings file bench wrote: ignored (the next bench replaces it)", path)
    return []


def write_tuned(path: str, fp: dict, settings: dict, figures: dict | None = None, keep: int = 8) -> None:
    """Record ``settings`` for fingerprint ``fp`` (and the ``figures`` that chose them), keeping the entries
    of other set-ups: one file serves e.g. a 1-process and a 2-process run on the same data side by side."""
    entries = tuned_entries(path)
    entry = {"fingerprint": fp, "loader": settings} | ({"figures": figures} if figures else {})
    entries = [entry, *(e for e in entries if e.get("fingerprint") != fp)][:keep]
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    header = "# Written by `bench`: loader settings for keys left at `auto`, per data/machine fingerprint.\n"
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(header + yaml.safe_dump({"entries": entries}, sort_keys=False), encoding="utf-8")
    tmp.replace(path)
