"""The loader benchmark's results: medians, side-by-side ratios, goals, memory, the machine.

``collect`` turns the measured rows into one JSON-able dict (``loaders.json``); report.py writes
it as Markdown and chart.py draws it. A ratio is the median over rounds of the two rows' values
in the same round (measured minutes apart at most), not the ratio of the medians: drift between
rounds cancels. A run of some groups only (``loaders.py --only``) gets the figures of those groups;
the goals need the rows of every group they name.

The ``epochs`` rows (probe.py's ``epochs``: two whole epochs a run) also get each epoch's images/s
per round and their medians, the second epoch against the first, and each epoch against the same
source's local files (``EPOCHS_LOCAL``) within each round.

A row rendered from the baseline commit (``loaders.py --baseline REF``) is named ``before(what, REF)``;
the rendered rows it is the "before" of (``befores``) get ``x_before``, their ratio to it in each round.
The ``train`` rows (probe.py's ``train``) also get the medians of what metrics.jsonl reported, of the
whole epoch's samples/s and of its first batch's seconds.
"""

from __future__ import annotations

import datetime
import os
import platform
import statistics
import subprocess
from pathlib import Path

BASELINE = "8b1aa5e"  # loaders.py --baseline's default: the commit before the batch pool became opt-in (issue 36)
# The rows the report names (224 px loaders, decoding, train), rendered from this checkout.
FOLDER = "folder (rendered)"
FOLDER_POOL = "folder (rendered, batch pool on)"  # loader.batch_pool=true, as bench turns it on where faster
CACHE = "cache (rendered, batch pool off: the default path)"
CACHE_POOL = "cache (rendered, batch pool on)"  # loader.batch_pool=true: the cache loader at its best
FULL_DECODE = "full decode (cv2.imdecode) + crop"
TASK_DECODE_STEM = "the task's train decode (reduced scale) + crop"
TASK_DECODE = f"{TASK_DECODE_STEM} (rendered, OpenCV)"
EIGHTH_DECODE = "reduced-scale decode to >= 256 px + crop (rendered, OpenCV)"
TRAIN_FOLDER = "train, folder (rendered)"
TRAIN_CACHE = "train, cache (rendered, pool off)"
TRAIN_CACHE_POOL = "train, cache (rendered, pool on)"
# The cache limit's work in a process per core at once: the machine's own ceiling for it (one process's
# rate x the cores assumes the cores share nothing).
TOGETHER = "cache limit, a process per core at once"
IMAGEFOLDER = "ImageFolder"  # rows whose name starts so are the tuned-baseline candidates
FLAT_MB = 16  # a worker's anonymous memory growing less than this over an epoch is "flat"
EPOCHS_LOCAL = "{source}, local (rendered)"  # the epochs row a source's others are compared with, epoch by epoch
TRAIN_FLOOR = 0.95  # train (CPU) no slower: rendered / before at least this
# The rows the goals are measured on: without one of them (a run of some groups), no goals. The goals on
# the baseline's rows or the train rows are pending without them.
GOAL_ROWS = (("224", CACHE_POOL), ("224", FOLDER), ("224", "shards, local (rendered)"))
GOAL_ROWS += (("64", "folder (rendered)"), ("64", "shards (rendered)"), ("decode", FULL_DECODE))
GOAL_ROWS += (("decode", TASK_DECODE),)


def before(what: str, ref: str) -> str:
    """The name of the row of ``what`` measured on the project rendered from the baseline ``ref``."""
    return f"{what} (before: {ref})"


def limits(ref: str | None) -> dict[str, str]:
    """Which limit row bounds which loader row (224 px); the baseline's rows with ``ref``."""
    out = {
        FOLDER: "folder limit",
        FOLDER_POOL: "folder limit",
        CACHE: "cache limit",
        CACHE_POOL: "cache limit",
        "cache, torchvision's crop (before)": "cache limit, torchvision's crop (before)",
        "shards, local (rendered)": "shards limit",
        "shards, loopback HTTP (rendered)": "shards limit",
        "parquet, local (rendered)": "parquet limit",
    }
    if ref:
        out |= {before("folder", ref): "folder limit (before)", before("cache", ref): "cache limit (before)"}
    return out


def befores(ref: str | None) -> dict[tuple[str, str], str]:
    """``{(group, rendered row): the baseline's row}``: what each rendered row is compared with (``x_before``)."""
    if not ref:
        return {}
    return {
        ("224", FOLDER): before("folder", ref),
        ("224", FOLDER_POOL): before("folder", ref),
        ("224", CACHE): before("cache", ref),
        ("224", CACHE_POOL): before("cache", ref),
        ("decode", TASK_DECODE): before(TASK_DECODE_STEM, ref),
        ("train", TRAIN_FOLDER): before("train, folder", ref),
        ("train", TRAIN_CACHE): before("train, cache", ref),
        ("train", TRAIN_CACHE_POOL): before("train, cache", ref),
    }


def split_rows(ref: str | None) -> tuple[str, ...]:
    """The 224 px loader rows whose CPU is read by role (probe.py's ``split``)."""
    if not ref:
        return (FOLDER, FOLDER_POOL, CACHE, CACHE_POOL)
    return (FOLDER, FOLDER_POOL, before("folder", ref), CACHE, CACHE_POOL, before("cache", ref))


def template_state(repo: Path) -> str:
    """The commit the projects are rendered from, and whether uncommitted changes were in them."""

    def git(*argv: str) -> str:
        out = subprocess.run(["git", *argv], cwd=repo, capture_output=True, text=True, check=False)
        return out.stdout.strip()

    return git("rev-parse", "--short", "HEAD") + (" + uncommitted changes" if git("status", "--porcelain") else "")


def machine(repo: Path, template: str | None = None) -> dict:
    import cv2
    import numpy
    import PIL
    import torch
    import torchvision
    import webdataset

    model = "unknown"
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    with open("/proc/meminfo") as f:
        mem_kb = int(f.readline().split()[1])

    return {
        "cpu": model,
        "usable_cores": len(os.sched_getaffinity(0)),
        "memory_gb": round(mem_kb / 2**20, 1),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torchvision": torchvision.__version__,
        "webdataset": getattr(webdataset, "__version__", "?"),
        "pillow": PIL.__version__,
        "numpy": numpy.__version__,
        "opencv": cv2.__version__,
        "torchcodec": _version("torchcodec"),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "template": template or template_state(repo),  # as rendered (main passes it), else as now
    }


def _version(package: str) -> str | None:
    import importlib.metadata

    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def _speeds(row: dict, rounds: int) -> list[float | None]:
    """The row's samples/s in each round (None where it failed or did not run)."""
    runs = row["runs"] + [None] * (rounds - len(row["runs"]))
    return [r["samples_per_s"] if r else None for r in runs]


def _per_cpu(row: dict, rounds: int) -> list[float | None]:
    """The row's samples per CPU-second of its own processes in each round."""
    runs = row["runs"] + [None] * (rounds - len(row["runs"]))
    return [r["samples_per_s"] / r["own_cores"] if r and r.get("own_cores") else None for r in runs]


def _ratio(a: list, b: list, scale: float = 1.0) -> float | None:
    pairs = [x / (y * scale) for x, y in zip(a, b) if x and y]
    return statistics.median(pairs) if pairs else None


def collect(rows, settings: dict, repo: Path, template: str | None = None) -> dict:
    """Everything the report shows, from the measured rows."""
    cores = len(os.sched_getaffinity(0))
    out = [
        {
            "name": r.name,
            "group": r.group,
            "pending": r.pending,
            "errors": r.errors,
            "runs": r.runs,
            "spec": {k: v for k, v in r.spec.items() if k not in ("files", "extra_pids")},
        }
        for r in rows
    ]
    rounds, ref = settings["rounds"], settings.get("baseline")
    limit_of, before_of = limits(ref), befores(ref)
    for row in out:
        row["speeds"], row["per_cpu"] = _speeds(row, rounds), _per_cpu(row, rounds)
        measured = [x for x in row["speeds"] if x]
        row["median"] = statistics.median(measured) if measured else None
        row["range"] = [min(measured), max(measured)] if measured else None
    by = {(r["group"], r["name"]): r for r in out}
    baselines = [r for r in out if r["group"] == "224" and r["name"].startswith(IMAGEFOLDER)]
    for row in out:
        measured = [x for x in row["per_cpu"] if x]
        row["median_cpu"] = statistics.median(measured) if measured else None
        for key in ("", "_cpu"):
            values = "per_cpu" if key else "speeds"
            tuned = [max((b[values][k] for b in baselines if b[values][k]), default=None) for k in range(rounds)]
            if row["group"] == "224":
                if ("224", FOLDER) in by:
                    row["x_folder" + key] = _ratio(row[values], by["224", FOLDER][values])
                row["x_imagefolder" + key] = _ratio(row[values], tuned)
                limit = by.get(("limit", limit_of.get(row["name"], "")))
                row["of_limit" + key] = _ratio(row[values], limit[values], 1 if key else cores) if limit else None
                if row["name"] in (CACHE, CACHE_POOL) and ("limit", TOGETHER) in by:
                    row["of_together" + key] = _ratio(row[values], by["limit", TOGETHER][values], 1 if key else cores)
            elif row["group"] == "64" and ("64", "folder (rendered)") in by:
                row["x_folder" + key] = _ratio(row[values], by["64", "folder (rendered)"][values])
            baseline = by.get((row["group"], before_of.get((row["group"], row["name"]), "")))
            if baseline is not None:
                row["x_before" + key] = _ratio(row[values], baseline[values])
    full = by.get(("decode", FULL_DECODE))
    for row in out:
        if row["group"] == "decode" and full is not None and row is not full:
            row["x_full"] = _ratio(row["speeds"], full["speeds"])
    _train(out, rounds)
    _epochs(out, rounds)
    result = {"machine": machine(repo, template), "settings": settings, "rows": out, "cores": cores}
    result["memory"] = {r["name"]: m for r in out if r["group"] == "224" and (m := _memory(r))}
    result["cpu_split"] = {
        name: _cpu_split(by["224", name], by["limit", limit_of[name]])
        for name in split_rows(ref)
        if ("224", name) in by and ("limit", limit_of[name]) in by
    }
    together = by.get(("limit", TOGETHER))
    for name in (CACHE, CACHE_POOL):
        if result["cpu_split"].get(name) and together and together["median_cpu"]:
            result["cpu_split"][name]["limit_together"] = 1e6 / together["median_cpu"]
    result["other_load"] = _other_load(out)
    complete = all(key in by for key in GOAL_ROWS)
    result["goals"] = _goals(result, by) if complete else []
    return result


def _train(rows: list[dict], rounds: int) -> None:
    """Add to each ``train`` row the medians over rounds of what metrics.jsonl reported (``reported_median``),
    of the whole epoch's samples/s, of its first batch's seconds and of the samples it trained on."""
    for row in rows:
        if row["group"] != "train":
            continue
        runs = [r for r in row["runs"] if r]
        for key in ("reported_samples_per_s", "whole_epoch_samples_per_s", "first_batch_s", "samples", "seconds"):
            seen = [r[key] for r in runs if r.get(key) is not None]
            row[key + "_median"] = statistics.median(seen) if seen else None


def _epochs(rows: list[dict], rounds: int) -> None:
    """Add to each ``epochs`` row its images/s by epoch in each round (``epoch_speeds``), their medians
    (``epoch_median``) and ranges, the median of epoch 2 / epoch 1 within each run (``epoch_ratio``) and of each
    epoch against the same source's local files in the same round (``x_local_epochs``), and medians of the first batch's
    seconds, the images/s after it, the CPU the run's processes used (cores), the shard cache's MB at each
    epoch's end, each epoch's seconds and images."""
    mine = [r for r in rows if r["group"] == "epochs"]
    locals_ = {r["name"]: r for r in mine}

    def per_round(row: dict, key: str) -> list:
        return [r.get(key) if r else None for r in row["runs"] + [None] * (rounds - len(row["runs"]))]

    def column(values: list, epoch: int) -> list:
        return [v[epoch] if v and len(v) > epoch else None for v in values]

    def median(values: list) -> float | None:
        seen = [v for v in values if v is not None]
        return statistics.median(seen) if seen else None

    for row in mine:
        speeds = row["epoch_speeds"] = per_round(row, "epoch_samples_per_s")
        n = max((len(v) for v in speeds if v), default=0)
        row["epoch_median"] = [median(column(speeds, e)) for e in range(n)]
        row["epoch_range"] = [
            [min(seen), max(seen)] if (seen := [v for v in column(speeds, e) if v]) else None for e in range(n)
        ]
        row["epoch_ratio"] = _ratio(column(speeds, 1), column(speeds, 0)) if n > 1 else None
        local = locals_.get(EPOCHS_LOCAL.format(source=row["name"].split(",")[0]))  # the same source's local files
        theirs = per_round(local, "epoch_samples_per_s") if local else None
        row["x_local_epochs"] = [_ratio(column(speeds, e), column(theirs, e)) for e in range(n)] if local else None
        medians = ("epoch_first_batch_s", "epoch_after_first_samples_per_s", "epoch_own_cores", "epoch_cache_mb")
        for key in (*medians, "epoch_s", "epoch_samples"):
            values = per_round(row, key)
            row[key] = [median(column(values, e)) for e in range(n)]


def _cpu_split(row: dict, limit: dict) -> dict | None:
    """Microseconds of CPU a sample by role (probe.py's role_cpu_s), medians over rounds, beside the
    limit's (one process's per-sample work, alone)."""
    seen = [r["cpu_us"] for r in row["runs"] if r and r.get("cpu_us")]
    if not seen or not limit["median_cpu"]:
        return None
    split = {role: statistics.median(s[role] for s in seen) for role in seen[0]}
    return {**split, "all": sum(split.values()), "limit": 1e6 / limit["median_cpu"]}


def _memory(row: dict) -> dict | None:
    """Per cache-loader worker, over one epoch: MB of Anonymous, Pss and Rss before and after."""
    seen = [r["memory"] for r in row["runs"] if r and r.get("memory")]
    if not seen:
        return None
    workers = [(b, a) for m in seen for b, a in zip(m["before"], m["after"]) if b["pid"] == a["pid"]]
    if not workers:
        return None

    def span(key: str) -> dict:
        return {
            "before": statistics.median(b[key] for b, _ in workers),
            "after": statistics.median(a[key] for _, a in workers),
            "max_growth": max(a[key] - b[key] for b, a in workers),
        }

    samples = statistics.median(m["samples"] for m in seen)
    return {"workers": len(workers), "samples": samples, **{key: span(key) for key in ("anonymous", "pss", "rss")}}


def _other_load(rows: list[dict]) -> dict | None:
    """Cores other jobs kept busy while the runs were timed (the machine's busy time minus the run's own)."""
    other = [
        max(0.0, r["busy_cores"] - r["own_cores"] * r.get("processes", 1))  # own_cores: each process's
        for row in rows
        for r in row["runs"]
        if r and "busy_cores" in r
    ]
    return {"median": statistics.median(other), "max": max(other)} if other else None


def crop_quality(result: dict) -> dict | None:
    """The crop's quality and cost by stored size (probe.py's crop_quality), if it was measured."""
    row = next((r for r in result["rows"] if r["group"] == "quality"), None)
    return next((r["quality"] for r in row["runs"] if r), None) if row else None


def handoff(result: dict) -> dict | None:
    """A worker's hand-off of a batch (probe.py's handoff), if it was measured."""
    row = next((r for r in result["rows"] if r["group"] == "handoff"), None)
    return next((r["handoff"] for r in row["runs"] if r), None) if row else None


def _crop_goal(result: dict) -> dict:
    text = "the workers' crop within 0.5 dB of torchvision's (PSNR against Lanczos-3, 100 photos)"
    quality = crop_quality(result)
    if quality is None:
        return {"goal": text, "value": None, "met": None, "note": "pending"}
    worst = min(q["delta_db"] for q in quality.values())
    note = "; ".join(
        f"{name}: {q['delta_db']:+.2f} dB, {q['us_ours']:.0f} us a crop against {q['us_torchvision']:.0f}"
        for name, q in quality.items()
    )
    return {"goal": text, "value": f"{worst:+.2f} dB", "met": worst >= -0.5, "note": note}


def _together(cache: dict) -> str:
    """The cache loader against the cache limit's work on every core at once (the machine's ceiling)."""
    if cache.get("of_together") is None:
        return ""
    return f"{cache['of_together']:.0%} of that work in a process per core at once"


def _pending(row: dict | None, why: str) -> str:
    return (row or {}).get("pending") or why


def _goals(result: dict, by: dict) -> list[dict]:
    """Each goal with its measured value: met, not met, reported (no target), or pending (and why)."""
    ref = result["settings"].get("baseline")
    no_baseline = "pending: no baseline (--baseline '')" if not ref else "pending: the baseline's row did not run"

    def goal(text: str, row: dict, key: str, target: float, note: str = "") -> dict:
        value, per_cpu = row.get(key), row.get(key + "_cpu")
        if value is None:
            why = no_baseline if key == "x_before" else "pending"
            return {"goal": text, "value": None, "met": None, "note": _pending(row, why)}

        def shown(v: float) -> str:
            return f"{v:.0%}" if key.startswith("of_limit") else f"{v:.2f}x"

        if per_cpu is not None:
            note = "; ".join(filter(None, [f"{shown(per_cpu)} per CPU-second", note]))
        return {"goal": text, "value": shown(value), "met": value >= target, "note": note}

    cache, pool_off, folder = by["224", CACHE_POOL], by.get(("224", CACHE)), by["224", FOLDER]
    shards64, shards224 = by["64", "shards (rendered)"], by["224", "shards, local (rendered)"]
    train, eighth = by["decode", TASK_DECODE], by.get(("decode", EIGHTH_DECODE)) or {}
    first = next((r for r in train["runs"] if r), None)
    scale = f"the train path decodes to {first['decoded'][2]} x {first['decoded'][1]} here" if first else ""
    scale += f"; at 1/8 scale: {eighth['x_full']:.2f}x" if eighth.get("x_full") else ""
    old = by.get(("decode", before(TASK_DECODE_STEM, ref))) if ref else None
    scale += f"; before ({ref}): {old['x_full']:.2f}x" if old and old.get("x_full") else ""
    off = f"pool off: {pool_off['x_folder']:.2f}x" if pool_off and pool_off.get("x_folder") else ""
    goals = [
        goal("cache loader, pool on, >= 4x the folder loader (224 px, 2 workers)", cache, "x_folder", 4, off),
        goal("cache loader, pool on, >= 6x a tuned ImageFolder (224 px)", cache, "x_imagefolder", 6),
        goal("cache loader, pool on, >= 80% of its limit", cache, "of_limit", 0.8, _together(cache)),
        _folder_goal(folder, no_baseline),
        _folder_goal(by.get(("224", FOLDER_POOL)) or {}, no_baseline, pool=True),
        goal("cache loader at its best setting (pool on) >= 0.95x before", cache, "x_before", 0.95),
        _pool_off_goal(pool_off, cache, no_baseline),
        _train_goal(by, ref, no_baseline),
        goal("shards >= 0.95x folder at 64 px", shards64, "x_folder", 0.95),
        goal("shards >= 0.95x folder at 224 px", shards224, "x_folder", 0.95),
        goal("reduced-scale decode >= 3x full decode (3000 px JPEGs, 224 crop)", train, "x_full", 3, scale),
    ]
    goals.append(_crop_goal(result))
    goals.append(_memory_goal(result, pool_off, ref))
    return goals


def _folder_goal(folder: dict, no_baseline: str, *, pool: bool = False) -> dict:
    """The folder loader (``pool``: with the batch pool on) against the baseline's and against its limit: both
    must hold."""
    text = "default folder loader >= 0.95x before and >= 90% of its limit"
    if pool:
        text = "folder loader with the pool on (where bench measures it faster) >= 0.95x before and >= 90% of its limit"
    x, share = folder.get("x_before"), folder.get("of_limit")
    if share is None:
        return {"goal": text, "value": None, "met": None, "note": _pending(folder, "pending: its limit did not run")}
    cpu = [f"{folder['of_limit_cpu']:.0%} of its limit per CPU-second"] if folder.get("of_limit_cpu") else []
    if folder.get("x_before_cpu"):
        cpu.insert(0, f"{folder['x_before_cpu']:.2f}x before per CPU-second")
    if x is None:
        note = "; ".join([no_baseline, *cpu])
        return {"goal": text, "value": f"{share:.0%} of its limit", "met": None, "note": note}
    return {
        "goal": text,
        "value": f"{x:.2f}x before; {share:.0%} of its limit",
        "met": x >= 0.95 and share >= 0.9,
        "note": "; ".join(cpu),
    }


def _pool_off_goal(pool_off: dict | None, pool_on: dict, no_baseline: str) -> dict:
    """The cache loader with the batch pool off (the default path): reported against the baseline and the pool."""
    text = "cache loader with the pool off (reported)"
    if pool_off is None or pool_off.get("x_folder") is None:
        return {"goal": text, "value": None, "met": None, "note": _pending(pool_off, "pending")}
    parts = [f"{pool_off['x_before']:.2f}x before"] if pool_off.get("x_before") is not None else []
    parts.append(f"{pool_off['x_folder']:.2f}x the folder loader")
    note = []
    if pool_off.get("x_before") is None:
        note.append(no_baseline)
    if pool_off.get("median") and pool_on.get("median"):
        note.append(f"{pool_off['median'] / pool_on['median']:.2f}x the pool on (medians)")
    if pool_off.get("of_limit") is not None:
        note.append(f"{pool_off['of_limit']:.0%} of its limit")
    return {"goal": text, "value": "; ".join(parts), "met": "reported", "note": "; ".join(note)}


def _train_goal(by: dict, ref: str | None, no_baseline: str) -> dict:
    """``train`` on the CPU, one epoch, rendered against the baseline's: each ratio at least TRAIN_FLOOR."""
    text = f"train (CPU) no slower: rendered/before >= {TRAIN_FLOOR:.2f}x"
    rows = [by.get(("train", name)) for name in (TRAIN_FOLDER, TRAIN_CACHE, TRAIN_CACHE_POOL)]
    if not any(rows):
        return {"goal": text, "value": None, "met": None, "note": "pending: the train group did not run"}
    ratios = {r["name"]: r.get("x_before") for r in rows if r}
    if not ref or any(v is None for v in ratios.values()):
        why = next((r["pending"] for r in rows if r and r["pending"]), no_baseline)
        return {"goal": text, "value": None, "met": None, "note": why}
    value = ", ".join(f"{name.removeprefix('train, ')}: {v:.2f}x" for name, v in ratios.items())
    note = "samples/s after the epoch's first batch, timed alike in both versions (see Training for one epoch)"
    return {"goal": text, "value": value, "met": all(v >= TRAIN_FLOOR for v in ratios.values()), "note": note}


def _memory_goal(result: dict, cache: dict | None, ref: str | None) -> dict:
    """The default cache loader's workers' anonymous memory over an epoch; the others' in the note."""
    text = f"cache workers' anonymous memory flat over an epoch (grows < {FLAT_MB} MB)"
    memory = result["memory"]
    mine = memory.get(CACHE)
    if mine is None:
        return {"goal": text, "value": None, "met": None, "note": _pending(cache, "pending")}
    others = [(name, memory.get(name)) for name in (CACHE_POOL, before("cache", ref) if ref else None, FOLDER)]
    note = "; ".join(f"{name}: {m['anonymous']['max_growth']:+.1f} MB" for name, m in others if name and m)
    growth = mine["anonymous"]["max_growth"]
    return {"goal": text, "value": f"{growth:+.1f} MB", "met": growth < FLAT_MB, "note": note}
