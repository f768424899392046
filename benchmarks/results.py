"""The loader benchmark's results: medians, side-by-side ratios, goals, memory, the machine.

``collect`` turns the measured rows into one JSON-able dict (``loaders.json``); report.py writes
it as Markdown and chart.py draws it. A ratio is the median over rounds of the two rows' values
in the same round (measured minutes apart at most), not the ratio of the medians: drift between
rounds cancels. A run of some groups only (``loaders.py --only``) gets the figures of those groups;
the goals need the rows of every group they name.

The ``epochs`` rows (probe.py's ``epochs``: two whole epochs a run) also get each epoch's images/s
per round and their medians, the second epoch against the first, and each epoch against local
shards (``EPOCHS_LOCAL``) within each round.
"""

from __future__ import annotations

import datetime
import os
import platform
import statistics
import subprocess
from pathlib import Path

# Which limit row bounds which loader row (224 px).
LIMITS = {
    "folder (rendered)": "folder limit",
    "cache (rendered)": "cache limit",
    "cache, torchvision's crop (before)": "cache limit, torchvision's crop (before)",
    "shards, local (rendered)": "shards limit",
    "shards, loopback HTTP (rendered)": "shards limit",
}
# The cache limit's work in a process per core at once: the machine's own ceiling for it (one process's
# rate x the cores assumes the cores share nothing).
TOGETHER = "cache limit, a process per core at once"
SPLIT = ("folder (rendered)", "cache (rendered)")  # the loader rows whose CPU is read by role
IMAGEFOLDER = "ImageFolder"  # rows whose name starts so are the tuned-baseline candidates
FLAT_MB = 16  # a worker's anonymous memory growing less than this over an epoch is "flat"
EPOCHS_LOCAL = "shards, local (rendered)"  # the epochs row the others are compared with, epoch by epoch
# The rows the goals are measured on: without one of them (a run of some groups), no goals.
GOAL_ROWS = (("224", "cache (rendered)"), ("224", "folder (rendered)"), ("224", "shards, local (rendered)"))
GOAL_ROWS += (("64", "folder (rendered)"), ("64", "shards (rendered)"))


def template_state(repo: Path) -> str:
    """The commit the projects are rendered from, and whether uncommitted changes were in them."""

    def git(*argv: str) -> str:
        out = subprocess.run(["git", *argv], cwd=repo, capture_output=True, text=True, check=False)
        return out.stdout.strip()

    return git("rev-parse", "--short", "HEAD") + (" + uncommitted changes" if git("status", "--porcelain") else "")


def machine(repo: Path, template: str | None = None) -> dict:
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
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "template": template or template_state(repo),  # as rendered (main passes it), else as now
    }


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
    rounds = settings["rounds"]
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
                row["x_folder" + key] = _ratio(row[values], by["224", "folder (rendered)"][values])
                row["x_imagefolder" + key] = _ratio(row[values], tuned)
                limit = by.get(("limit", LIMITS.get(row["name"], "")))
                row["of_limit" + key] = _ratio(row[values], limit[values], 1 if key else cores) if limit else None
                if row["name"] == "cache (rendered)" and ("limit", TOGETHER) in by:
                    row["of_together" + key] = _ratio(row[values], by["limit", TOGETHER][values], 1 if key else cores)
            elif row["group"] == "64":
                row["x_folder" + key] = _ratio(row[values], by["64", "folder (rendered)"][values])
    decode = [r for r in out if r["group"] == "decode"]
    for row in decode[1:]:
        row["x_full"] = _ratio(row["speeds"], decode[0]["speeds"])
    _epochs(out, rounds)
    result = {"machine": machine(repo, template), "settings": settings, "rows": out, "cores": cores}
    result["memory"] = _memory(by["224", "cache (rendered)"]) if ("224", "cache (rendered)") in by else None
    result["folder_memory"] = _memory(by["224", "folder (rendered)"]) if ("224", "folder (rendered)") in by else None
    result["cpu_split"] = {
        name: _cpu_split(by["224", name], by["limit", LIMITS[name]])
        for name in SPLIT
        if ("224", name) in by and ("limit", LIMITS[name]) in by
    }
    together = by.get(("limit", TOGETHER))
    if result["cpu_split"].get("cache (rendered)") and together and together["median_cpu"]:
        result["cpu_split"]["cache (rendered)"]["limit_together"] = 1e6 / together["median_cpu"]
    result["other_load"] = _other_load(out)
    complete = all(key in by for key in GOAL_ROWS) and len(decode) >= 3
    result["goals"] = _goals(result, by, decode) if complete else []
    return result


def _epochs(rows: list[dict], rounds: int) -> None:
    """Add to each ``epochs`` row its images/s by epoch in each round (``epoch_speeds``), their medians
    (``epoch_median``) and ranges, the median of epoch 2 / epoch 1 within each run (``epoch_ratio``) and of each
    epoch against local shards' in the same round (``x_local_epochs``), and medians of the first batch's
    seconds, the images/s after it, the CPU the run's processes used (cores), the shard cache's MB at each
    epoch's end, each epoch's seconds and images."""
    mine = [r for r in rows if r["group"] == "epochs"]
    local = next((r for r in mine if r["name"] == EPOCHS_LOCAL), None)

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


def _goals(result: dict, by: dict, decode: list[dict]) -> list[dict]:
    """Each goal of issues 10 and 18 with its measured value: met, not met, or pending (and why)."""

    def goal(text: str, row: dict, key: str, target: float, note: str = "") -> dict:
        value, per_cpu = row.get(key), row.get(key + "_cpu")
        if value is None:
            return {"goal": text, "value": None, "met": None, "note": row["pending"] or "pending"}

        def shown(v: float) -> str:
            return f"{v:.0%}" if key.startswith("of_limit") else f"{v:.2f}x"

        if per_cpu is not None:
            note = "; ".join(filter(None, [f"{shown(per_cpu)} per CPU-second", note]))
        return {"goal": text, "value": shown(value), "met": value >= target, "note": note}

    cache, folder = by["224", "cache (rendered)"], by["224", "folder (rendered)"]
    shards64, shards224 = by["64", "shards (rendered)"], by["224", "shards, local (rendered)"]
    train, eighth = decode[1], decode[2]
    first = next((r for r in train["runs"] if r), None)
    scale = f"the train path decodes to {first['decoded'][2]} x {first['decoded'][1]} here" if first else ""
    scale += f"; at 1/8 scale: {eighth['x_full']:.2f}x" if eighth.get("x_full") else ""
    goals = [
        goal("cache loader >= 4x the folder loader (224 px, 2 workers)", cache, "x_folder", 4),
        goal("cache loader >= 6x a tuned ImageFolder (224 px)", cache, "x_imagefolder", 6),
        goal("cache loader >= 80% of its limit", cache, "of_limit", 0.8, _together(cache)),
        goal("folder loader >= 90% of its limit", folder, "of_limit", 0.9),
        goal("shards >= 0.95x folder at 64 px", shards64, "x_folder", 0.95),
        goal("shards >= 0.95x folder at 224 px", shards224, "x_folder", 0.95),
        goal("reduced-scale decode >= 3x full decode (3000 px JPEGs, 224 crop)", train, "x_full", 3, scale),
    ]
    goals.append(_crop_goal(result))
    memory = result["memory"]
    text = f"cache workers' anonymous memory flat over an epoch (grows < {FLAT_MB} MB)"
    if memory is None:
        goals.append({"goal": text, "value": None, "met": None, "note": cache["pending"] or "pending"})
    else:
        growth, folder = memory["anonymous"]["max_growth"], result["folder_memory"]
        note = f"the folder loader's: {folder['anonymous']['max_growth']:+.1f} MB (see Worker memory)" if folder else ""
        goals.append({"goal": text, "value": f"{growth:+.1f} MB", "met": growth < FLAT_MB, "note": note})
    return goals
