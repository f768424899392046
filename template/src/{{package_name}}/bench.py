"""Data-loading benchmark: the training loop minus the model, run before training.

    python -m <package> bench              # sweep num_workers x prefetch_factor (<= --budget-s)
    python -m <package> bench --quick      # a few seconds; `train` runs this when needed

Times the loader alone on the train split with its real transforms, after a warm-up:
samples/s, ms per batch (median, p90) and time to the first batch. Picks the cheapest
setting with workers (fewest, then least prefetch) within 5% of the best measured; the
``num_workers=0`` row is reported as the baseline (loading inside the training process, which
cannot overlap the step). Writes the choice,
with the fingerprint of this data and machine, to ``configs/tuned.yaml``. Reports go to
``<run_dir>/bench/bench.{json,md,png}``.
"""

from __future__ import annotations

import copy
import json
import logging
import statistics
import time
from dataclasses import asdict
from pathlib import Path

from . import dist
from .data import build_loader
from .data.loader import resolve_settings, set_epoch
from .data.tuned import fingerprint, write_tuned

log = logging.getLogger(__name__)

TOLERANCE = 0.05  # settings within 5% of the best count as equally fast


def measure(loader, batches: int, warmup: int = 2) -> dict:
    """Iterate ``loader`` (over epochs if it is short) and time it.

    Returns samples/s over the timed batches, ms per batch (median, p90) and seconds to
    the first batch of the first epoch.
    """
    times, samples, epoch, first_batch_s = [], 0, 0, None
    while len(times) < batches + warmup:
        set_epoch(loader, epoch)
        start = last = time.perf_counter()
        got = 0
        for batch in loader:
            now = time.perf_counter()
            if first_batch_s is None:
                first_batch_s = now - start
            times.append(now - last)
            if len(times) > warmup:
                samples += len(batch["target"])
            last, got = now, got + 1
            if len(times) >= batches + warmup:
                break
        if got == 0:
            raise RuntimeError("the loader yielded no batch; is the dataset empty?")
        epoch += 1
    timed = sorted(times[warmup:])
    total = sum(timed)
    return {
        "samples_per_s": round(samples / total, 1) if total > 0 else float("inf"),
        "ms_per_batch": round(1000 * statistics.median(timed), 2),
        "ms_per_batch_p90": round(1000 * timed[int(0.9 * (len(timed) - 1))], 2),
        "first_batch_s": round(first_batch_s, 3),
    }


def grid(quick: bool) -> list[tuple[int, int]]:
    """``(num_workers, prefetch_factor)`` pairs to try, cheapest first."""
    most = max(1, dist.usable_cpus() // dist.local_world_size())
    workers = sorted({0, 1, most} if quick else {0, 1, 2, 4, 6, 8, most} & set(range(most + 1)))
    prefetch = (2,) if quick else (2, 4)
    return [(w, p) for w in workers for p in ((2,) if w == 0 else prefetch)]


def choose(points: list[dict]) -> dict:
    """The cheapest measured point within ``TOLERANCE`` of the fastest.

    ``num_workers=0`` is the baseline row only: there, loading runs in the training process
    and adds to every step instead of overlapping it, so a loader-alone figure flatters it.

    >>> choose([{"num_workers": 2, "prefetch_factor": 2, "samples_per_s": 100.0},
    ...         {"num_workers": 4, "prefetch_factor": 2, "samples_per_s": 103.0}])["num_workers"]
    2
    """
    candidates = [p for p in points if p["num_workers"] > 0] or points
    best = max(p["samples_per_s"] for p in candidates)
    good = [p for p in candidates if p["samples_per_s"] >= (1 - TOLERANCE) * best]
    return min(good, key=lambda p: (p["num_workers"], p["prefetch_factor"]))


def run_bench(cfg, dataset, quick: bool = False, budget_s: float = 60.0, batches: int | None = None) -> dict:
    """Sweep the loader settings, write ``configs/tuned.yaml`` and the reports; return the report."""
    batches = batches or (6 if quick else 30)
    base = resolve_settings(cfg, dataset)
    points, deadline = [], time.perf_counter() + budget_s
    for num_workers, prefetch_factor in grid(quick):
        if points and time.perf_counter() > deadline:
            log.info("bench: --budget-s %.0f spent; skipping the remaining settings", budget_s)
            break
        variant = copy.deepcopy(cfg)
        variant.loader.num_workers = num_workers
        variant.loader.prefetch_factor = prefetch_factor
        variant.loader.persistent_workers = True
        variant.loader.pin_memory = base.pin_memory
        variant.loader.tuned = ""
        loader = build_loader(dataset, variant, "train", rank=0, world_size=1)
        point = {"num_workers": num_workers, "prefetch_factor": prefetch_factor, **measure(loader, batches)}
        del loader  # stops its workers before the next setting starts
        points.append(point)
        log.info("bench: %s", point)
    chosen = choose(points)
    tuned_loader = {
        "num_workers": chosen["num_workers"],
        "prefetch_factor": chosen["prefetch_factor"],
        "persistent_workers": True,
        "pin_memory": base.pin_memory,
    }
    report = {
        "fingerprint": fingerprint(cfg, dataset),
        "batch_size": cfg.loader.batch_size,
        "batches_timed": batches,
        "points": points,
        "chosen": tuned_loader,
        "chosen_point": chosen,
        "default_rule": asdict(base),
    }
    if cfg.loader.tuned:
        write_tuned(cfg.loader.tuned, report["fingerprint"], tuned_loader)
    write_reports(Path(cfg.train.run_dir) / "bench", report)
    return report


def quick_bench(cfg, dataset) -> dict:
    return run_bench(cfg, dataset, quick=True, budget_s=15.0)


def table(report: dict) -> str:
    """The sweep as a Markdown table, the chosen row marked."""
    rows = [
        "| num_workers | prefetch_factor | samples/s | ms/batch (median) | ms/batch (p90) | first batch (s) |",
        "| ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    c = report["chosen_point"]
    for p in report["points"]:
        mark = " **chosen**" if p is c or p == c else ""
        rows.append(
            f"| {p['num_workers']}{mark} | {p['prefetch_factor']} | {p['samples_per_s']:.1f} | "
            f"{p['ms_per_batch']:.2f} | {p['ms_per_batch_p90']:.2f} | {p['first_batch_s']:.3f} |"
        )
    return "\n".join(rows)


def write_reports(out: Path, report: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench.json").write_text(json.dumps(report, indent=2), encoding="utf-8")
    fp = report["fingerprint"]
    md = [
        "# Data-loading benchmark",
        "",
        f"Loader alone on `{fp['data_root']}` ({fp['data_size']} samples, {fp['source']}/{fp['format']}), "
        f"batch size {report['batch_size']}, {fp['cpus']} CPUs, local world size {fp['local_world_size']}, "
        f"torch {fp['torch']}.",
        "",
        table(report),
        "",
        f"Chosen (cheapest within {TOLERANCE:.0%} of the best): `{report['chosen']}`",
        "",
    ]
    (out / "bench.md").write_text("\n".join(md), encoding="utf-8")
    plot(out / "bench.png", report)


def plot(path: Path, report: dict) -> None:
    """Throughput against num_workers, one line per prefetch_factor, the chosen point marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4), dpi=100)
    for pf in sorted({p["prefetch_factor"] for p in report["points"]}):
        pts = [p for p in report["points"] if p["prefetch_factor"] == pf or p["num_workers"] == 0]
        pts.sort(key=lambda p: p["num_workers"])
        ax.plot(
            [p["num_workers"] for p in pts],
            [p["samples_per_s"] for p in pts],
            marker="o",
            label=f"prefetch_factor={pf}",
        )
    c = report["chosen_point"]
    ax.scatter(
        [c["num_workers"]],
        [c["samples_per_s"]],
        s=180,
        facecolors="none",
        edgecolors="red",
        linewidths=2,
        label="chosen",
        zorder=3,
    )
    ax.set_xlabel("num_workers")
    ax.set_ylabel("samples/s (loader alone)")
    ax.set_title("Data-loading throughput")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
