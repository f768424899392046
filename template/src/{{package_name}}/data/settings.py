# torchfeed's file: `copier update` replaces it. Your model is model.py; your augmentations, loss and
# metric are task.py; your settings configs/default.yaml (README.md: "Which files are yours").
"""The loaders' settings, resolved once and held against /dev/shm, and ``configs/tuned.yaml``, where
`bench` keeps what it chose.

    settings = loader_settings(cfg, {"train": train_set, "val": val_set}, saved)
    train_loader = build_loader(train_set, cfg, "train", settings["train"])

A ``loader`` key left at ``auto`` takes bench's value for this data and machine (an entry of
``configs/tuned.yaml`` whose fingerprint matches), else the default rule; `train` runs a quick
bench first when no entry matches.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
from pathlib import Path
from typing import Any

import torch
import yaml
from torch.utils.data import IterableDataset

from .. import dist, project
from ..errors import SharedMemoryFull
from .source import SkipBadCollate, Source, data_settings, generators_kept

log = logging.getLogger(__name__)
AUTO = "auto"
KEYS = ("num_workers", "prefetch_factor", "persistent_workers", "pin_memory", "batch_pool")


@dataclasses.dataclass
class LoaderSettings:
    """What `bench` tunes, resolved to values: four of DataLoader's arguments, and ``batch_pool``
    (data/batch_pool.py: workers reuse the shared memory of their batches). The fields' defaults are a
    bare loader's, for a check or a probe; a run's come from :func:`loader_settings`."""

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
    feed), prefetch 2, persistent workers (training's only), pinned memory with a GPU, no batch pool. Then what the
    loaders need of /dev/shm is held against what is free there (``plan_shm``, below),
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
        # Validation workers start for each evaluation and end after it: kept, they would sit idle
        # through every training epoch, each a process holding its own memory (and a batch pool's blocks).
        train = split == "train" and settings.num_workers > 0
        settings.persistent_workers = settings.persistent_workers and train
        settings.batch_pool = settings.batch_pool and train
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


# NOTE [ The loaders' batches and a container's /dev/shm ]
# A worker hands each batch over in shared memory, a file in /dev/shm, which a container keeps
# small (Docker: 64 MB unless `--shm-size`). A loader with w workers and prefetch_factor p holds
# up to w x p batches in flight while training holds 2 more; a batch pool (batch_pool.py) keeps
# its blocks while its workers live, through validation too. Before any worker starts, what the
# loaders of this node's training processes need is held against what is free: the pool gets
# what fits beside torch's own need, and too little even for that is one line naming the size,
# the need and the fixes, not a bus error in a worker in the middle of an epoch.
SHM = "/dev/shm"
HELD = 2  # batches the training process holds while the next one arrives
MARGIN = 2 << 20  # for the rest: the batches' small tensors, multiprocessing's own
MOST_BLOCKS = 8  # the most a worker's batch pool keeps
FIXES = (
    "give it more: `docker run --shm-size=1g` (or `--ipc=host`), on Kubernetes a volume `emptyDir: {medium: Memory}` "
    "mounted at /dev/shm; or lower loader.num_workers (0 needs none), loader.prefetch_factor or loader.batch_size"
)


def shm_space() -> tuple[int, int] | None:
    """``(size, free)`` bytes of /dev/shm; ``None`` where there is none (macOS, Windows: no such limit)."""
    try:
        st = os.statvfs(SHM)
    except OSError:
        return None
    return st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize


def mb(n: float) -> str:
    """``n`` bytes in MB, as a message gives them.

    >>> mb(9_633_792), mb(67_108_864)
    ('9.6 MB', '67 MB')
    """
    return f"{n / 1e6:.2g} MB" if n < 1e7 else f"{n / 1e6:.0f} MB"


def plan_shm(datasets: dict[str, Any], settings: dict, batch_size: int, processes: int | None = None) -> dict[str, int]:
    """Hold the loaders' need of /dev/shm (``{split: dataset}`` at ``{split: LoaderSettings}``, of this node's
    ``processes`` training processes: default ``dist.processes_per_node()``) against what is free there: size
    each batch pool (``pool_blocks``) to what fits beside it, down to none. Returns each loader's need
    without a pool, in bytes.

    Raises :class:`SharedMemoryFull` naming the loader that does not fit even without a pool.
    """
    sizes = {k: batch_bytes(d, batch_size) if settings[k].num_workers else 0 for k, d in datasets.items()}
    needs = {k: shm_need(s, sizes[k]) for k, s in settings.items()}
    for s in settings.values():  # a pool for the training loader alone (loader_settings)
        s.pool_blocks = MOST_BLOCKS if s.batch_pool and s.num_workers else 0
    if (space := shm_space()) is None:
        return needs
    processes = processes or dist.processes_per_node()
    budget = space[1] // processes - MARGIN
    for split, s in settings.items():
        if s.num_workers and needs[split] > budget:
            each = f" of each of this node's {processes} training processes" if processes > 1 else ""
            raise SharedMemoryFull(
                f"/dev/shm holds {mb(space[0])} ({mb(space[1])} free), and the {split} loader{each} needs "
                f"{mb(needs[split])} of it: loader.num_workers={s.num_workers} x loader.prefetch_factor="
                f"{s.prefetch_factor} batches in flight and {HELD} the training process holds, each "
                f"{mb(sizes[split])} (loader.batch_size={batch_size}); {FIXES}"
            )

    def peak() -> int:  # one loader runs while the others' pools wait (those of ended workers: till a new one)
        run = {
            k: (s.num_workers * max(s.prefetch_factor, s.pool_blocks) + HELD) * sizes[k] for k, s in settings.items()
        }
        kept = {k: s.num_workers * s.pool_blocks * sizes[k] for k, s in settings.items()}  # mapped till the next epoch
        return max(run[k] + sum(kept.values()) - kept[k] for k in settings)

    for s in settings.values():
        while s.pool_blocks and peak() > budget:
            s.pool_blocks = s.pool_blocks - 1 if s.pool_blocks > 2 else 0
        if s.batch_pool and s.num_workers and not s.pool_blocks:
            log.info(
                "/dev/shm (%s free) has no room for a batch pool beside the loaders: torch's own way", mb(space[1])
            )
    return needs


def shm_need(settings, batch: int) -> int:
    """The bytes of /dev/shm a loader at ``settings`` (LoaderSettings) holds at the most without a pool, its
    batches ``batch`` bytes each: its workers' batches in flight, and those the training process holds."""
    return (settings.num_workers * settings.prefetch_factor + HELD) * batch if settings.num_workers else 0


def batch_bytes(dataset, batch_size: int) -> int:
    """The shared memory of one batch: a few of the source's first samples read with its task and batched
    (the random generators left as they were); 0 when unknown (not a :class:`Source`, or none reads)."""
    if not isinstance(dataset, Source):
        return 0
    samples = []
    with generators_kept():
        for data in dataset.peek(16):
            with contextlib.suppress(Exception):  # a bad sample: the next one may do
                samples.append({"input": dataset.task(data), "target": 0, "key": ""})
            if len(samples) == min(batch_size, 4):
                break
        batch = SkipBadCollate(dataset.task.collate)(samples) if samples else {}
    if "error" in batch:
        raise batch.pop("error")  # popped: the error's traceback holds this frame (data/loader.py: Loader._checked)
    return sum(v.nbytes for v in batch.values() if torch.is_tensor(v)) * batch_size // max(1, len(samples))
