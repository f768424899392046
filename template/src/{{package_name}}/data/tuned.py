# torchfeed's file: `copier update` replaces it. Your model is model.py; your augmentations, loss and
# metric are task.py; your settings configs/default.yaml (README.md: "Which files are yours").
"""``configs/tuned.yaml``: the loader settings `bench` chose, per data/machine fingerprint.

Loader keys left at ``auto`` take the tuned value while the fingerprint of the data and the
machine still matches; `train` re-runs a quick bench when none does.

``data`` keys left at ``auto`` (where a sample is transformed: :func:`with_bench_choice`) take the
values of the entry whose ``chosen`` lists them: `bench` timed each of their values on this data
and machine, kept the fastest, and tuned the loader for it (that entry's fingerprint holds them).
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

import torch
import yaml

from .. import dist, shm
from .source import Source, data_settings

AUTO = "auto"
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
        "shm_mb": None if (room := shm.space()) is None else round(room.size / 2**20),  # /dev/shm caps the settings
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


def auto_data_keys(cfg) -> list[str]:
    """The ``data`` keys left at ``auto``: bench's choice sets them (:func:`with_bench_choice`)."""
    return [k for k, v in data_settings(cfg).items() if v == AUTO]


def with_bench_choice(cfg, dataset, saved: dict | None = None):
    """``cfg`` with each ``data`` key left at ``auto`` set as `bench` chose it for this data and machine.

    A resumed run (``saved``: its checkpoint) keeps the values it began with, ``auto`` included (its
    crops are then the ones the checkpoint's run would have drawn); else the entry whose fingerprint
    matches but for these keys, and whose ``chosen`` lists them all, gives them; else they stay
    ``auto`` (the format reads it as its default). Called before the train split's dataset that
    trains is built: ``dataset`` only gives the source's fingerprint.
    """
    keys = auto_data_keys(cfg)
    if not keys:
        return cfg
    if saved is not None:
        was = (saved.get("config") or {}).get("data") or {}
        chosen, why = {k: was[k] for k in keys if k in was}, f"as {saved.get('path', 'the checkpoint')} began"
    else:
        chosen, why = bench_choice(cfg, dataset, keys), f"bench's choice for this data and machine ({cfg.loader.tuned})"
    chosen = {k: v for k, v in chosen.items() if v != AUTO}
    if not chosen:
        if saved is None:
            log.info(
                "%s: bench has not timed them for this data and machine: their default (`bench` on a GPU, or "
                "`bench --paths`, times them)",
                " ".join(f"data.{k}=auto" for k in keys),
            )
        return cfg
    log.info("%s: %s", " ".join(f"data.{k}={v}" for k, v in chosen.items()), why)
    return dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, **chosen))


def bench_choice(cfg, dataset, keys: list[str]) -> dict:
    """The values of ``keys`` in the entry for this data and machine where bench chose all of them by
    timing each ({} when there is none: an entry that timed fewer keys chose among fewer values)."""
    ours = _leave_out(fingerprint(cfg, dataset), keys)
    for entry in _tuned_entries(cfg.loader.tuned):
        theirs, timed = entry.get("fingerprint"), entry.get("chosen")
        if not (isinstance(theirs, dict) and isinstance(timed, list) and set(keys) <= set(timed)):
            continue
        if _leave_out(theirs, keys) == ours:
            return {k: theirs["data"][k] for k in keys if k in theirs["data"]}
    return {}


def _leave_out(fp: dict, keys: list[str]) -> dict:
    """A fingerprint without the ``data`` keys ``keys``: entries that differ only there are one set-up."""
    data = fp.get("data")
    return fp | {"data": {k: v for k, v in data.items() if k not in keys} if isinstance(data, dict) else data}


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


def write_tuned(path: str, fp: dict, settings: dict, keep: int = 8, chosen: list[str] | None = None) -> None:
    """Record ``settings`` for fingerprint ``fp``, keeping the entries of other set-ups.

    One file serves e.g. a 1-process and a 2-process run on the same data side by side.
    ``chosen``: the ``data`` keys whose values in ``fp`` bench chose by timing each; the entry records
    them (and any other entry of this set-up that chose the same keys no longer does). An entry
    rewritten without ``chosen`` (a later sweep at the chosen values) keeps what it recorded.
    """
    entries = _tuned_entries(path)
    was = next((e for e in entries if e.get("fingerprint") == fp), {})
    entry = {"fingerprint": fp, "loader": settings}
    if chosen:
        entry["chosen"] = sorted(chosen)
        mine = _leave_out(fp, chosen)
        for other in entries:
            theirs = other.get("fingerprint")
            if (
                other.get("chosen") == entry["chosen"]
                and isinstance(theirs, dict)
                and _leave_out(theirs, chosen) == mine
            ):
                other.pop("chosen")
    elif was.get("chosen"):
        entry["chosen"] = was["chosen"]
    entries = [entry, *(e for e in entries if e.get("fingerprint") != fp)][:keep]
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    header = (
        "# Written by `bench`: loader settings for keys left at `auto`, per data/machine fingerprint;\n"
        "# `chosen`: the data keys bench timed (left at `auto`), choosing this entry's values of them.\n"
    )
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(header + yaml.safe_dump({"entries": entries}, sort_keys=False), encoding="utf-8")
    tmp.replace(path)
