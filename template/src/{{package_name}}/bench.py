# torchfeed's file: `copier update` replaces it. Your model is model.py; your augmentations, loss and
# metric are task.py; your settings configs/default.yaml (README.md: "Which files are yours").
"""Data-loading benchmark: the training loop minus the model, run before writing model code.

    python -m <package> bench              # sweep, stall, checks, report (<= --budget-s for the sweep)
    python -m <package> bench --quick      # a few seconds; `train` runs this when the tuned file is stale

1. The loader alone, on the train split with its real transforms, after a warm-up:
   samples/s, ms per batch (median, p90), time to the first batch, peak RSS of the main
   process and of the workers. Swept over num_workers (0 up to the usable CPUs) for each
   prefetch_factor, a branch stopping once adding workers stops helping, within --budget-s.
2. The choice: the cheapest setting with workers (fewest, then least prefetch) within 5% of
   the best; ``num_workers=0`` is reported as the baseline (loading inside the training
   process cannot overlap the step). Then, at that setting, the batch pool (data/batch_pool.py:
   workers reuse their batches' shared memory) on against off, persistent_workers by the epoch
   switch and, with CUDA, pin_memory by the host-to-device copy: each is on only where measured
   faster. The choice goes to ``configs/tuned.yaml`` with the fingerprint of this data and
   machine, and the figures that made it.
3. The stall: the model's training step (build_model, task.py's loss) on a real batch, on the
   training device, against the loader's time per batch: how much of a step would wait for data;
   and the capacity verdict: the loader CPUs each training process needs for a stall under 5%.
   With ``data.cache`` set, the source at ``data.root`` is timed at the chosen setting too:
   the cache's speed-up over it. With ``data.mix``, each entry alone, and the one that limits the mix.
4. The checks (checks.py): handle leaks, a consumed iterator, duplicated samples, worker
   memory growth, repeated augmentations (whatever task.py's train transform does), a
   collate that cannot batch.

Reports: ``<run_dir>/bench/bench.{json,md,png}``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import logging
import math
import socket
import statistics
import sys
import time
from pathlib import Path

import psutil
import torch
from tqdm import tqdm

from . import dist, project
from .checks import run_checks, worker_processes
from .data import build_loader, set_epoch
from .data.cache import CacheSource
from .data.loader import no_batch_left
from .data.settings import (
    LoaderSettings,
    batch_bytes,
    fingerprint,
    loader_settings,
    plan_shm,
    shm_need,
    shm_space,
    write_tuned,
)
from .data.source import Source
from .errors import SharedMemoryFull
from .report import write_reports

log = logging.getLogger(__name__)

TOLERANCE = 0.05  # settings within 5% of the best count as equally fast


def _rss_mb() -> tuple[float, float]:
    """RSS of this process and of the largest of its DataLoader workers, in MB."""
    me = psutil.Process()
    workers = []
    for w in worker_processes():
        with contextlib.suppress(psutil.Error):
            workers.append(w.memory_info().rss)
    return me.memory_info().rss / 2**20, max(workers, default=0) / 2**20


def measure(loader, batches: int, warmup: int = 2, device: torch.device | None = None) -> dict:
    """Iterate ``loader`` (over epochs if it is short) and time it.

    Args:
        loader: the DataLoader to time.
        batches (int): batches timed after ``warmup`` untimed ones.
        device (torch.device, optional): also copy each batch there as training does: queued
            (``non_blocking``) with a kernel reading it, the host waiting for the device only
            at the end, so copies overlap the loading of the next batches.

    Returns samples/s, ms per batch (median, p90), seconds to the first batch of the first
    epoch, and peak RSS (MB) of the main process and of the largest worker.
    """
    times, samples, epoch, first_batch_s, peak = [], 0, 0, None, (0.0, 0.0)
    sink = torch.zeros((), device=device) if device is not None else None
    timed_from = None
    while len(times) < batches + warmup:
        set_epoch(loader, epoch)
        start = last = time.perf_counter()
        got = 0
        for batch in loader:
            if sink is not None:  # the input: a batch, or a list of samples the device finishes
                inputs = batch["input"] if isinstance(batch["input"], list) else [batch["input"]]
                for x in inputs:
                    sink += x.to(device, non_blocking=True).float().mean()
            now = time.perf_counter()
            if len(times) == warmup:
                timed_from = last
            if first_batch_s is None:
                first_batch_s = now - start
            times.append(now - last)
            if len(times) > warmup:
                samples += len(batch["key"])
            if len(times) % 8 == 0:
                peak = tuple(max(a, b) for a, b in zip(peak, _rss_mb()))
            last, got = time.perf_counter(), got + 1
            if len(times) >= batches + warmup:
                break
        if got == 0:  # a source that could not count its batches ahead (build_loader checks those that can)
            raise no_batch_left(loader.batch_size, dist.get_world_size(), loader.num_workers)
        epoch += 1
    peak = tuple(max(a, b) for a, b in zip(peak, _rss_mb()))
    timed = sorted(times[warmup:])
    total = sum(timed)
    if sink is not None and device.type == "cuda":
        torch.cuda.synchronize(device)  # the copies still queued count too
        total = time.perf_counter() - timed_from
    return {
        "samples_per_s": round(samples / total, 1) if total > 0 else float("inf"),
        "ms_per_batch": round(1000 * statistics.median(timed), 2),
        "ms_per_batch_p90": round(1000 * timed[int(0.9 * (len(timed) - 1))], 2),
        "first_batch_s": round(first_batch_s, 3),
        "rss_main_mb": round(peak[0], 1),
        "rss_worker_mb": round(peak[1], 1),
    }


def worker_counts(quick: bool, dataset=None) -> list[int]:
    """num_workers to try, ascending: 0 (the baseline) up to the usable CPUs of this process,
    and no more than the source can feed (Source.max_workers)."""
    most = max(1, dist.usable_cpus() // dist.processes_per_node())
    if isinstance(dataset, Source) and dataset.max_workers() is not None:
        most = max(1, min(most, dataset.max_workers()))
    if quick:
        return sorted({0, 1, most})
    return sorted({0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, most} & set(range(most + 1)))


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


def _loader(cfg, dataset, **settings):
    """A train loader of ``dataset`` at these settings (the others at the default rule's), its /dev/shm need checked."""
    chosen = LoaderSettings(**({"persistent_workers": True} | settings))
    plan_shm({"train": dataset}, {"train": chosen}, cfg.loader.batch_size)
    return build_loader(dataset, cfg, "train", chosen)


def sweep(cfg, dataset, quick: bool, budget_s: float, batches: int) -> tuple[list[dict], list[dict]]:
    """Measure (num_workers, prefetch_factor) settings, torch's own way (no batch pool); a branch stops when
    more workers stop helping, or when its next setting does not fit in /dev/shm. Returns the points and the
    settings skipped so.

    Raises :class:`SharedMemoryFull` when no setting with workers fits: the sweep would choose none.
    """
    workers = worker_counts(quick, dataset)
    branches = (2,) if quick else (2, 4)
    batch = batch_bytes(dataset, cfg.loader.batch_size)
    least = LoaderSettings(num_workers=1, prefetch_factor=min(branches))
    plan_shm({"train": dataset}, {"train": least}, cfg.loader.batch_size)  # the cheapest with workers fits, or one line
    deadline = time.perf_counter() + budget_s
    points: list[dict] = []
    skipped: list[dict] = []
    bar = tqdm(
        total=1 + (len(workers) - 1) * len(branches),
        desc="bench",
        leave=False,
        disable=quick or not sys.stderr.isatty(),
    )
    plan = [[(0, 2)]] + [[(w, p) for w in workers if w > 0] for p in branches]
    for branch in plan:
        best = 0.0
        for num_workers, prefetch_factor in branch:
            if points and time.perf_counter() > deadline:
                log.info("bench: --budget-s %.0f spent; skipping the remaining settings", budget_s)
                bar.close()
                return points, skipped
            settings = {"num_workers": num_workers, "prefetch_factor": prefetch_factor}
            need = round(shm_need(LoaderSettings(**settings), batch) / 1e6, 1)
            try:
                loader = _loader(cfg, dataset, **settings)
            except SharedMemoryFull as e:  # so would more workers be: this branch ends
                skipped.append({**settings, "shm_mb": need, "why": str(e)})
                log.warning("bench: skipped num_workers=%d prefetch_factor=%d: %s", num_workers, prefetch_factor, e)
                break
            point = {**settings, "shm_mb": need, **measure(loader, batches)}
            del loader  # stops its workers before the next setting starts
            points.append(point)
            bar.update()
            log.info("bench: %s", point)
            if point["samples_per_s"] < best * (1 + TOLERANCE / 2):
                break  # throughput stopped rising: more workers in this branch cost more for nothing
            best = max(best, point["samples_per_s"])
    bar.close()
    return points, skipped


def pool_figures(cfg, dataset, chosen: dict, batches: int, rounds: int = 2) -> dict:
    """Samples/s at the chosen setting with the batch pool and without (data/batch_pool.py), alternating: each
    setting's runs (``runs``: the sweep's run at this setting among those without) and its best (other jobs on
    the machine slow a run, never speed it up)."""
    runs = {"on": [], "off": [chosen["samples_per_s"]]}
    settings = {"num_workers": chosen["num_workers"], "prefetch_factor": chosen["prefetch_factor"]}
    for _ in range(rounds):
        for pool in (True, False):
            try:
                loader = _loader(cfg, dataset, **settings, batch_pool=pool)
            except SharedMemoryFull:
                return {}
            runs["on" if pool else "off"].append(measure(loader, batches)["samples_per_s"])
            del loader
    return {"off": max(runs["off"]), "on": max(runs["on"]), "runs": runs}


def pool_faster(runs: dict) -> bool:
    """Whether the batch pool is faster: its best run beats the best without it, the sweep's run at this setting
    among those, by more than TOLERANCE. Other jobs slow a run, never speed it up, so each side's best is its
    figure; the sweep's run keeps two runs without the pool that other jobs slowed from turning it on.

    >>> pool_faster({"on": [1448.0, 1301.0], "off": [1251.0, 1169.0, 1153.0]})
    True
    >>> pool_faster({"on": [8070.0, 6900.0], "off": [7914.0, 4044.0, 4100.0]})  # the sweep's run: as fast
    False
    """
    return max(runs["on"]) > (1 + TOLERANCE) * max(runs["off"])


def epoch_switch_s(cfg, dataset, chosen: dict, persistent: bool, repeats: int = 3) -> float:
    """Median seconds from asking for a new epoch to its first batch (after one warm epoch)."""
    settings = {k: chosen[k] for k in ("num_workers", "prefetch_factor", "batch_pool")}
    loader = _loader(cfg, dataset, **settings, persistent_workers=persistent)
    next(iter(loader))
    times = []
    for epoch in range(1, repeats + 1):
        set_epoch(loader, epoch)
        start = time.perf_counter()
        next(iter(loader))
        times.append(time.perf_counter() - start)
    return round(statistics.median(times), 4)


def stall(cfg, dataset, loader_samples_per_s: float) -> dict:
    """The model's own consumption against the loader: the training step (with ``task``'s loss) on a real
    batch already on the training device (no copy, no loading), timed alone; how much of a step would
    wait for data at the loader's measured rate."""
    from .compute import make_optimizer, setup_compute, train_step
    from .model import build_model

    device, task = dist.pick_device(project.NUM_GPUS), dataset.task
    batch = next(b for b in _loader(cfg, dataset, num_workers=0) if len(b["key"]) >= 2)
    batch = task.on_device(batch, device)
    batch = {k: v.to(device) if torch.is_tensor(v) else v for k, v in batch.items()}  # the inputs wait there
    model = build_model(cfg, dataset.num_classes, task.sample_shape).to(device)
    model.train()
    compute = setup_compute(cfg.train.amp, device, model)
    optimizer = make_optimizer(model, cfg.optim, device)
    times = []
    for i in range(12):  # 3 warm-up steps, 9 timed
        start = time.perf_counter()
        train_step(model, task, optimizer, batch, compute)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if i >= 3:
            times.append(time.perf_counter() - start)
    step_s = statistics.median(times)
    model_rate = len(batch["key"]) / step_s
    ratio = loader_samples_per_s / model_rate
    if ratio < 1:
        verdict = (
            f"data-bound: the loader delivers {ratio:.0%} of what the model consumes; "
            f"about {1 - ratio:.0%} of each step would be spent waiting for data"
        )
    else:
        verdict = f"compute-bound: the loader delivers {ratio:.1f}x what the model consumes"
    return {
        "device": str(device),
        "model_ms_per_step": round(1000 * step_s, 2),
        "model_samples_per_s": round(model_rate, 1),
        "loader_over_model": round(ratio, 3),
        "waiting_fraction": round(max(0.0, 1 - ratio), 3),
        "verdict": verdict,
    }


STALL_GOAL = 0.05  # the capacity verdict sizes the loader for a stall under 5% of each step


def capacity(
    points: list[dict], chosen: dict, model_samples_per_s: float, cpus: int, processes: int, remedies: list[str]
) -> dict:
    """How many loader CPUs each training process needs for a stall under 5%, and what this node gives.

    One worker's delivery rate is the sweep's 1-worker point (else the chosen point's rate per worker);
    the loader scales about linearly with workers up to the cores it has, so a process needs
    ``0.95 x model rate / worker rate`` workers, each a CPU, and one CPU more for itself. The stall
    to expect here is the one at the fastest setting measured.

    >>> points = [{"num_workers": 1, "prefetch_factor": 2, "samples_per_s": 500.0}]
    >>> c = capacity(points, points[0], model_samples_per_s=3000.0, cpus=2, processes=1, remedies=["pack a cache"])
    >>> c["loader_cpus_needed"], c["cpus_per_process_needed"], c["expected_stall"]
    (6, 7, 0.833)
    >>> c["verdict"].split("; ")[1:]  # doctest: +NORMALIZE_WHITESPACE
    ['this node gives each 2 (one runs the process itself): expect a 83% stall',
     'ask for 7 CPUs per process (Slurm: --cpus-per-task=7 per GPU), or pack a cache']
    """
    ones = [p["samples_per_s"] for p in points if p["num_workers"] == 1]
    per_worker = max(ones) if ones else chosen["samples_per_s"] / max(1, chosen["num_workers"])
    needed = max(1, math.ceil((1 - STALL_GOAL) * model_samples_per_s / max(per_worker, 1e-9)))
    given = max(1, cpus // max(1, processes))
    expected = max(0.0, 1 - max(p["samples_per_s"] for p in points) / model_samples_per_s)
    head = f"this model needs {needed} loader CPU{'s' * (needed > 1)} per training process"
    if expected <= STALL_GOAL:
        verdict = f"{head}; the loader keeps up here (expected stall {expected:.0%})"
    else:
        asks = [f"ask for {needed + 1} CPUs per process (Slurm: --cpus-per-task={needed + 1} per GPU)", *remedies]
        verdict = (
            f"{head}; this node gives each {given} (one runs the process itself): expect a {expected:.0%} stall; "
            f"{', '.join(asks[:-1])}, or {asks[-1]}"
        )
    return {
        "model_samples_per_s": round(model_samples_per_s, 1),
        "worker_samples_per_s": round(per_worker, 1),
        "loader_cpus_needed": needed,
        "cpus_per_process_needed": needed + 1,
        "cpus_per_process_given": given,
        "expected_stall": round(expected, 3),
        "verdict": verdict,
    }


def cache_speedup(cfg, chosen: dict, batches: int) -> dict:
    """The source (``data.root``) at the setting chosen for its cache: how much faster the cache is."""
    from .data import source_class

    source = source_class(cfg.data.source).open(cfg, "train")
    workers = min(chosen["num_workers"], source.max_workers() or chosen["num_workers"])
    loader = _loader(cfg, source, num_workers=workers, prefetch_factor=chosen["prefetch_factor"])
    rate = measure(loader, batches)["samples_per_s"]
    return {
        "source_samples_per_s": rate,
        "cache_samples_per_s": chosen["samples_per_s"],
        "speedup": round(chosen["samples_per_s"] / rate, 2),
    }


def mix_entries(cfg, mix, chosen: dict, batches: int) -> dict:
    """Each entry of a mix (``data.mix``) alone at the setting chosen for the mix, and the entry that limits it.

    The mix spends ``share / rate`` of its time per sample on each entry (its asked share, its rate alone): the
    entry with the largest part limits the mix, and ``1 / sum(share / rate)`` is what the entries allow it.
    """
    entries, shares = {}, mix.shares()
    alone = dataclasses.replace(cfg, loader=dataclasses.replace(cfg.loader, drop_last=False))  # a small one cycles
    for e in mix.entries:
        loader = _loader(alone, e.source, num_workers=chosen["num_workers"], prefetch_factor=chosen["prefetch_factor"])
        rate = measure(loader, batches)["samples_per_s"]
        time_per_sample = shares[e.name] / max(rate, 1e-9)  # a rate of 0: every sample of it bad
        entries[e.name] = {"samples_per_s": rate, "share": round(shares[e.name], 4), "time": time_per_sample}
        del loader
    total = sum(e["time"] for e in entries.values())
    for e in entries.values():
        e["time_share"] = round(e.pop("time") / total, 3)  # of the mix's time per sample
    limiting = max(entries, key=lambda name: entries[name]["time_share"])
    return {
        "entries": entries,
        "mix_samples_per_s": chosen["samples_per_s"],
        "entries_allow_samples_per_s": round(1 / total, 1),
        "limiting": limiting,
    }


def bench_command(
    cfg, quick: bool = False, budget_s: float = 60.0, time_paths: bool = False, batches: int | None = None
) -> dict:
    """`bench`: :func:`run_bench` on the train split (``data.cache`` when set, else the source); where the
    format has several places to crop and decode a sample (its task's ``time_paths``: in the workers, or
    on the device), each timed first with the model's step on a GPU, or anywhere with ``time_paths``."""
    from .data import build_dataset

    paths, dataset = None, build_dataset(cfg, "train")
    gpu = torch.cuda.is_available() and project.NUM_GPUS > 0
    timed = getattr(dataset.task, "time_paths", None)  # where a sample can be cropped, if in several places
    if not quick and (gpu or time_paths) and timed is not None:
        from .model import build_model

        paths = timed(cfg, dist.pick_device(project.NUM_GPUS), build_model, batches or 30)
    elif time_paths:
        log.warning("bench --paths: %s", "--quick times no paths" if quick else "the format has one place to crop")
    every_rank = dist.is_distributed()  # `launch -- bench`: each rank runs it, and they compare (ranks)
    return run_bench(cfg, dataset, quick=quick, budget_s=budget_s, batches=batches, paths=paths, ranks=every_rank)


def run_bench(
    cfg,
    dataset,
    quick: bool = False,
    budget_s: float = 60.0,
    batches: int | None = None,
    paths: dict | None = None,
    ranks: bool = False,
) -> dict:
    """Sweep, choose, (unless quick) measure the stall and run the checks; write the tuned file and reports.

    ``dataset`` is the train split; the stall's model step computes its task's loss. ``paths``: the places
    a sample can be cropped and decoded, timed (:func:`bench_command`), for the report. ``ranks``: every
    rank of the process group runs this, and their figures are compared (:func:`compare_ranks`).
    """
    batches = batches or (6 if quick else 30)
    base = loader_settings(cfg, {"train": dataset}, plan=False)["train"]  # the default rule's; pin_memory's default
    points, skipped = sweep(cfg, dataset, quick, budget_s, batches)
    chosen = choose(points)
    tuned = {
        "num_workers": chosen["num_workers"],
        "prefetch_factor": chosen["prefetch_factor"],
        "persistent_workers": True,
        "pin_memory": base.pin_memory,
        "batch_pool": False,
    }
    report = {
        "fingerprint": fingerprint(cfg, dataset),
        "batch_size": cfg.loader.batch_size,
        "quick": quick,
        "batches_timed": batches,
        "points": points,
        "chosen_point": chosen,
        "default_rule": dataclasses.asdict(base),
    }
    figures = {}
    if chosen["num_workers"] > 0 and (pool := pool_figures(cfg, dataset, chosen, batches)):
        # on only where measured faster: it is beyond torch's public API (data/batch_pool.py)
        tuned["batch_pool"] = pool_faster(pool["runs"])
        figures["batch_pool_samples_per_s"] = pool
    gc.collect()  # the timed loaders are gone: their workers' blocks are unmapped here too (batch_pool.py)
    if (space := shm_space()) is not None:  # what /dev/shm allows: each point's need, the settings skipped
        report["shm"] = {"size_mb": round(space[0] / 1e6, 1), "free_mb": round(space[1] / 1e6, 1), "skipped": skipped}
    if not quick and chosen["num_workers"] > 0:
        switch = {
            "persistent": epoch_switch_s(cfg, dataset, tuned, True),
            "fresh": epoch_switch_s(cfg, dataset, tuned, False),
        }
        tuned["persistent_workers"] = switch["persistent"] < (1 - TOLERANCE) * switch["fresh"]
        figures["epoch_switch_s"] = switch
    if not quick and torch.cuda.is_available() and project.NUM_GPUS > 0:
        device = dist.pick_device(project.NUM_GPUS)
        settings = {k: tuned[k] for k in ("num_workers", "prefetch_factor", "batch_pool")}
        copy_rate = {
            pin: measure(_loader(cfg, dataset, **settings, pin_memory=pin), batches, device=device)["samples_per_s"]
            for pin in (False, True)
        }
        # Pinned memory lets copies run alongside the step; it stays on unless measured slower.
        tuned["pin_memory"] = not copy_rate[False] > (1 + TOLERANCE) * copy_rate[True]
        figures["pin_memory_samples_per_s"] = {str(k): v for k, v in copy_rate.items()}
    report |= figures
    if not quick and isinstance(dataset, CacheSource):
        report["cache"] = cache_speedup(cfg, chosen, batches)
    if not quick and cfg.data.mix:
        report["mix"] = mix_entries(cfg, dataset, chosen, batches)
    if paths is not None:
        report["paths"] = paths
    if not quick:
        report["stall"] = stall(cfg, dataset, chosen["samples_per_s"])
        cpus, processes = dist.usable_cpus(), dist.processes_per_node()
        remedies = ["pack a cache (pack --to cache)"] if not isinstance(dataset, CacheSource) else []
        remedies += getattr(dataset.task, "remedies", ())  # a format's own (the crop on the device)
        model_rate = report["stall"]["model_samples_per_s"]
        report["capacity"] = capacity(points, chosen, model_rate, cpus, processes, remedies)
        report["checks"] = [dataclasses.asdict(c) for c in run_checks(cfg, dataset, tuned["num_workers"])]
    report["chosen"] = tuned
    if ranks:  # under `launch -- bench` every rank measures (they share the node); one writes
        report["ranks"] = compare_ranks(report)
    if dist.get_rank() == 0:
        if cfg.loader.tuned:
            write_tuned(cfg.loader.tuned, report["fingerprint"], tuned, figures)
        write_reports(Path(cfg.train.run_dir) / "bench", report)
    return report


RANK_RATE_RATIO = 3.0  # a rank whose loader delivers a third of the others' median, or less, is named


def compare_ranks(report: dict) -> dict:
    """What every rank measured at its chosen setting (a collective: every rank calls it), the slowest
    rank, and a line naming it where its loader delivers ``1 / RANK_RATE_RATIO`` of the others' median
    or less: every rank trains at the pace of the slowest."""
    chosen = report["chosen_point"]
    mine = {"rank": dist.get_rank(), "host": socket.gethostname(), "samples_per_s": chosen["samples_per_s"]}
    mine |= {"num_workers": chosen["num_workers"], "waiting_fraction": report.get("stall", {}).get("waiting_fraction")}
    every = dist.all_gather_object(mine)
    slowest = min(every, key=lambda r: r["samples_per_s"])
    out = {"by_rank": every, "slowest_rank": slowest["rank"]}
    if len(every) < 2:  # `launch -- bench` of one process: no other rank to compare with
        return out
    others = statistics.median(r["samples_per_s"] for r in every if r is not slowest)
    if slowest["samples_per_s"] * RANK_RATE_RATIO <= others:
        out["warning"] = (
            f"rank {slowest['rank']} ({slowest['host']}) loads {slowest['samples_per_s']:.0f} samples/s, "
            f"{others / max(slowest['samples_per_s'], 1e-9):.1f}x less than the other ranks' median ({others:.0f}), "
            "and every rank trains at its pace: its loader is slower than theirs. Likely causes: less data to read "
            "in parallel there (fewer pieces of the data than it has workers), a slower disk or mount on its "
            "node, fewer CPUs for its workers, or other jobs on that node"
        )
        log.warning("%s", out["warning"])
    return out


def quick_bench(cfg, dataset) -> dict:
    return run_bench(cfg, dataset, quick=True, budget_s=15.0)
