"""The loader benchmark's report as Markdown: the machine, the tables, the goals, what is pending.

``markdown`` renders what ``results.collect`` gathered (``loaders.json`` holds the same dict): the
sections of the groups that ran (all of them, unless ``loaders.py --only`` chose some).
"""

from __future__ import annotations

from results import BASELINE, CACHE, FLAT_MB, FOLDER, TOGETHER, TRAIN_FLOOR, before, crop_quality, handoff


def _n(value, spec: str = ".0f", none: str = "–") -> str:
    return none if value is None else format(value, spec)


def _x(value) -> str:
    return _n(value, ".2f") + ("x" if value is not None else "")


def _pct(value) -> str:
    return "–" if value is None else f"{value:.0%}"


def _speed_cells(row: dict) -> list[str]:
    if row["pending"]:
        return ["pending", "–"]
    low, high = row["range"] or (None, None)
    return [_n(row["median"]), f"{_n(low)}–{_n(high)}"]


def _table(header: list[str], lines: list[list[str]], numbers: int | None = None) -> list[str]:
    """A Markdown table; the columns after the first, or the first ``numbers`` of them, align right."""
    right = len(header) - 1 if numbers is None else numbers
    align = ["---"] + ["---:"] * right + ["---"] * (len(header) - 1 - right)
    return ["| " + " | ".join(cells) + " |" for cells in (header, align, *lines)]


def markdown(result: dict) -> str:
    """The report as Markdown: the machine, the tables, the goals, what is pending."""
    m, s, cores, other = result["machine"], result["settings"], result["cores"], result["other_load"]
    groups = ("224", "limit", "64", "decode", "train", "epochs")
    group = {g: [r for r in result["rows"] if r["group"] == g] for g in groups}
    ran = {r["group"] for r in result["rows"]}
    only, ref = s.get("only"), s.get("baseline")
    timed = (
        f"timed for {s['seconds']:g} s after 3 warm-up batches, across epoch ends"
        if ran - {"epochs", "train"}
        else "timed over whole epochs"
    )
    text = [
        "# Loader benchmark" + (f" (only {', '.join(only)})" if only else ""),
        "",
        f"Measured {m['date']} on {m['cpu']}, {cores} usable cores, {m['memory_gb']} GB; Python {m['python']}, "
        f"torch {m['torch']}, torchvision {m['torchvision']}, webdataset {m['webdataset']}, Pillow {m['pillow']}"
        + "".join(f", {k} {m[k]}" for k in ("opencv", "torchcodec") if m.get(k))
        + f"; template {m['template']}"
        + (f", baseline {ref} ({(s.get('baseline_commit') or '')[:12]})" if ref else ", no baseline")
        + f". Written by `benchmarks/loaders.py` in {s['run_s'] / 60:.1f} min.",
        "",
        f"Every loader: batch {s['batch_size']}, num_workers {s['workers']}, prefetch_factor 2, persistent workers, "
        f"the same random-resized crop (scale 0.35-1) and flip on uint8 tensors. Each run is its own process, {timed}. "
        f"{s['rounds']} rounds alternate the "
        "rows (each round runs every row once, starting one row further on): a row's value is its median, a "
        "ratio the median of the two rows' ratios within each round, so other jobs' load affects a round's "
        "rows alike.",
    ]
    if ref:
        text += [
            "",
            f"A row marked *(before: {ref})* runs the default folder image project (num_gpus 0) rendered from the "
            f"baseline commit {ref} on the same data, with that version's defaults"
            + (
                " (its batch pool on, crops written into the pool's blocks, PIL's reduced-scale JPEG decode)"
                if ref == BASELINE
                else ""
            )
            + "; its cache is packed by its own `pack --to cache`. *x before* is a rendered row against the "
            "baseline's same row, within each round. "
            "*(before)* alone, as in torchvision's crop, means before `crops.RandomResizedCropFlip`.",
        ]
    if other:
        load = f"{other['median']:.1f} of the {cores} cores busy"
        load += f" (median over the timed windows, at most {other['max']:.1f})"
        if other["median"] < 0.25:
            text[-1] += f" Other jobs were nearly idle: {load}."
        else:
            text[-1] += (
                f" Other jobs kept {load}: absolute numbers are low by about that share, and a single-process limit "
                "suffers less from it than a loader needing every core."
            )
        if ran - {"epochs", "train"}:
            text[-1] += (
                " The tables also give samples per CPU-second (of all the run's processes), and the goals each ratio "
                "per CPU-second: how the rows compare with the cores they got."
            )
    if "224" in ran or "limit" in ran:
        text += _224_sections(result, group)
    if "64" in ran:
        text += [
            "",
            "## 64 px crops of each project's `sample-data` (64 px images, half JPEG, half PNG)",
            "",
            f"{s['small_per_class'] * 4} train images, the same bytes in every source (files, 8 shards, SQLite rows, "
            "Parquet rows in 8 row groups).",
            "",
        ]
        lines = [[r["name"], *_speed_cells(r), _x(r.get("x_folder")), _n(r["median_cpu"])] for r in group["64"]]
        text += _table(["loader", "samples/s", "range", "x folder", "samples/CPU-s"], lines)
    if "decode" in ran:
        text += _decode_section(group["decode"])
    if "train" in ran:
        text += _train_section(group["train"], s, ref)
    text += _crop_section(crop_quality(result))
    text += _handoff_section(handoff(result))
    text += _split_section(result.get("cpu_split") or {}, s["workers"])
    if "224" in ran:
        text += _memory_section(result["memory"], s["workers"], ref)
    if "epochs" in ran:
        text += _epochs_section(group["epochs"], s, cores)
    if result["goals"]:
        text += ["", "## Goals", ""]
        verdict = {True: "met", False: "**not met**", None: "pending", "reported": "reported"}
        lines = [[g["goal"], g["value"] or "–", verdict[g["met"]], g["note"]] for g in result["goals"]]
        text += _table(["goal", "measured", "", "note"], lines, numbers=1)
    pending = [r for r in result["rows"] if r["pending"]]
    failed = [r for r in result["rows"] if r["errors"] and not r["pending"]]
    if pending or failed:
        text += ["", "## Pending and failed runs", ""]
        text += [f"- {r['name']} ({r['group']}): {r['pending']}" for r in pending]
        text += [f"- {r['name']} ({r['group']}): {len(r['errors'])} run(s) failed: {r['errors'][-1]}" for r in failed]
    rerun = f" --only {','.join(only)}" if only else ""
    rerun += "" if ref == BASELINE else f" --baseline {ref or repr('')}"
    text += ["", f"Rerun: `.venv/bin/python benchmarks/loaders.py{rerun}` (`--help` lists the settings).", ""]
    return "\n".join(text)


def _224_sections(result: dict, group: dict) -> list[str]:
    """The 224 px loaders' table (if they ran) and their limits' (if they ran)."""
    s, cores = result["settings"], result["cores"]
    cache = f", {s['cache_mb']:.0f} MB for train" if s.get("cache_mb") else ""
    text = ["", "## 224 px crops from 400-600 px JPEG photos", ""]
    if group["224"]:
        text += [
            f"{s['images']} train photos, quality 90 ({s['photo_mb']:.0f} MB with val; `benchmarks/photos.py`), in "
            f"class folders, packed into {s['shards']} shards (`pack --to shards`), into Parquet (`pack --to parquet`: "
            f"the Hub's layout, row groups of {s.get('parquet_group_rows', 100)} photos) and into the cache "
            f"(`pack --to cache`: decoded, shorter side 256{cache}). The tuned ImageFolder is the faster of its two "
            "rows in each round. The rendered cache loader runs with its batch pool off (the default: "
            "`loader.batch_pool` is on only where `bench` measured it faster) and on (`loader.batch_pool=true`, "
            "data/batch_pool.py).",
            "",
        ]
        header = ["loader", "samples/s", "range", "x folder", "x before", "x tuned ImageFolder", "of its limit"]
        header += ["samples/CPU-s", "x before per CPU-s", "of its limit per CPU-s"]
        lines = [
            [r["name"], *_speed_cells(r), _x(r.get("x_folder")), _x(r.get("x_before")), _x(r.get("x_imagefolder"))]
            + [_pct(r.get("of_limit")), _n(r["median_cpu"]), _x(r.get("x_before_cpu")), _pct(r.get("of_limit_cpu"))]
            for r in group["224"]
        ]
        text += _table(header, lines)
    if not group["limit"]:
        return text
    text += [
        *([""] if group["224"] else []),
        "Limits: one process's per-sample work on the rendered source (on the baseline's: the rows named `... limit "
        f"(before)`), no DataLoader, x {cores} cores. The cache's is also run in {cores} processes at once, timed "
        f"over the same window ({TOGETHER}: each process's samples/s, and their sum): the machine's own ceiling for "
        "that work, which the cores' shared caches and memory can put below the first.",
        "",
    ]
    lines = [
        [r["name"], *_speed_cells(r), _n(r["median"] and r["median"] * cores), _n(r["median_cpu"])]
        for r in group["limit"]
    ]
    return text + _table(["limit", "one process, samples/s", "range", f"x {cores} cores", "samples/CPU-s"], lines)


def _epochs_section(rows: list[dict], s: dict, cores: int) -> list[str]:
    """Two whole epochs of the 224 px shards and Parquet files: local, and from moto's S3 server with and
    without the node's cache."""
    photo = f" ({s['photo_mb']:.0f} MB of photos with val)" if s.get("photo_mb") else ""
    text = [
        "",
        "## Two epochs of 224 px shards and Parquet files: local, and from S3 on loopback",
        "",
        f"The {s['images']} train photos{photo}, packed into {s['shards']} shards (`pack --to shards`) and into "
        f"Parquet files of {s.get('parquet_group_rows', 100)} rows a row group (`pack --to parquet`), read by the "
        "rendered loaders from local disk, and from moto's S3 server (`python -m moto.server`, a real HTTP "
        f"S3 API) on loopback, on the same {cores} cores as the loader: an S3 row measures the client's path and "
        "the node's cache, not a network. Each run is a process of its own and starts with an empty "
        "`data.cache_dir`; with the cache (`data.cache_limit` at its default, 50GB) the first epoch downloads "
        "each shard or file whole (the next `data.prefetch_shards`, 2, or the next file, fetched while one is "
        "read) and the second reads them from local disk; with `data.cache_limit=0` both epochs stream every "
        "shard, and read each Parquet row group's two columns in ranged GETs. Each epoch is timed in full, "
        "from its first batch request to its last batch: the first epoch includes the start of the persistent "
        "workers in every row alike (the second table gives the first batch's seconds, and the images/s after "
        "it). Setting up the dataset (an S3 listing, the index or the footers, and the first shard or file, read "
        "through the cache to prepare the task) is not timed. Medians of "
        f"{s['rounds']} rounds; a ratio is the median of its ratios within each run (epoch 2 / epoch 1) or "
        "round (x local: the same source's local files); CPU cores counts the run's processes and, for S3, "
        "moto's server.",
        "",
    ]
    header = ["row", "epoch 1 images/s", "epoch 2 images/s", "epoch 2 / epoch 1"]
    header += ["x local, epoch 1", "x local, epoch 2"]
    lines = []
    for r in rows:
        if r["pending"] or not r.get("epoch_median"):
            lines.append([r["name"], "pending" if r["pending"] else "failed", "–", "–", "–", "–"])
            continue
        speed, ratios = r["epoch_median"], r.get("x_local_epochs") or [None, None]
        lines.append([r["name"], _n(speed[0]), _n(speed[1] if len(speed) > 1 else None), _x(r.get("epoch_ratio"))])
        lines[-1] += [_x(ratios[0]), _x(ratios[1] if len(ratios) > 1 else None)]
    text += _table(header, lines)
    text += [""]
    header = ["row", "epoch 1 range", "epoch 2 range", "epoch 1: first batch (s)", "epoch 1 after it, images/s"]
    header += ["images an epoch", "CPU cores, epoch 1", "CPU cores, epoch 2", "cache after epoch 1 (MB)"]
    header += ["cache after epoch 2 (MB)"]
    lines = []
    for r in rows:
        if r["pending"] or not r.get("epoch_median"):
            continue
        spans = [f"{_n(x[0])}–{_n(x[1])}" if x else "–" for x in r["epoch_range"]]
        own, mb = r["epoch_own_cores"], r["epoch_cache_mb"]
        after = r["epoch_after_first_samples_per_s"][0]
        lines.append([r["name"], *spans[:2], _n(r["epoch_first_batch_s"][0], ".2f"), _n(after)])
        lines[-1] += [_n(r["epoch_samples"][0])]
        lines[-1] += [_n(x, ".2f") for x in own[:2]] + [_n(x) for x in mb[:2]]
    return text + _table(header, lines)


def _handoff_section(h: dict | None) -> list[str]:
    if not h:
        return []
    ms = h["ms"]
    text = [
        "",
        "## A worker's hand-off of a batch",
        "",
        f"{h['batch']} crops of {h['size']} px (uint8, HWC), one core, the best of 5 passes of 40 batches: "
        "`default_collate` in a loader worker stacks a batch into a new shared-memory block, which the "
        "training process then maps (no copy there); a new block's pages are zeroed and mapped as they are "
        "first written. With `loader.batch_pool=true` (off by default; `bench` turns it on where it measures it "
        "faster) a worker stacks into a block of its own pool, written before, once the training process is "
        "done with it (data/batch_pool.py, `Pool.stack`): the third row.",
        "",
    ]
    lines = [
        ["into a new shared-memory block (a worker's default_collate)", _n(ms["shared"], ".2f"), _n(h["us_a_sample"])],
        ["the new block alone, untouched", _n(ms["shared_block_alone"], ".2f"), "–"],
    ]
    if "shared_reused" in ms:  # measured since the workers reuse their blocks
        lines.append(
            [
                "into a block written before (the batch pool's)",
                _n(ms["shared_reused"], ".2f"),
                _n(1e3 * ms["shared_reused"] / h["batch"]),
            ]
        )
    lines += [
        ["torch.stack into ordinary memory", _n(ms["heap"], ".2f"), _n(1e3 * ms["heap"] / h["batch"])],
    ]
    return text + _table(["stacking a batch", "ms a batch", "us a sample"], lines)


def _split_section(split: dict, workers: int) -> list[str]:
    if not any(split.values()):
        return []
    text = [
        "",
        "## Where a loader's CPU goes",
        "",
        "Microseconds of CPU a sample while each loader was timed (medians over the rounds), by role, from "
        "/proc: a loader worker's main thread reads, decodes, crops and flips each sample, as the limit's one "
        "process does alone, and also seeds the generators its augmentation draws from (torch's alone for the "
        "project's crop; the limit's process saves and restores torch's), stacks the batch and "
        f"runs the DataLoader's loop, sharing the cores with the other {workers - 1} worker(s) and the training "
        "process; the workers' other threads pickle each batch onto the queue; the training process unpickles "
        "it and yields it. The last column is what the loader spends a sample beyond the limit's work; the "
        "second, what the limit's work costs a process while every core runs it (the cache's only).",
        "",
    ]
    lines = []
    for name, us in split.items():
        if us:
            cells = [us["limit"], us["worker"], us["worker_threads"], us["training"], us["all"]]
            together = _n(us["limit_together"]) if "limit_together" in us else "–"
            lines.append([name, _n(cells[0]), together, *(_n(x) for x in cells[1:]), f"{us['all'] - us['limit']:+.0f}"])
    header = ["loader", "limit (one process)", "limit, every core at once", "workers' main threads"]
    header += ["workers' other threads", "training process", "all", "beyond the limit"]
    return text + _table(header, lines)


def _crop_section(quality: dict | None) -> list[str]:
    if not quality:
        return []
    text = [
        "",
        "## The workers' crop (`crops.RandomResizedCropFlip`) against torchvision's",
        "",
        "The same boxes (the workers' crop's draw, RandomResizedCrop's distribution, scale 0.35-1) on the same "
        "pixels, one core: PSNR of each against a float64 Lanczos-3 resize of the box, and microseconds a crop "
        "(median). From the cache the images have a shorter side of 256; the folder loader decodes a JPEG at the "
        "smallest scale keeping its shorter side at least 438 (the task's `min_side`). The crop resizes a box "
        "shrinking by at most 1.25x with OpenCV (bilinear, no antialias), others with torchvision's antialiased "
        "bilinear.",
        "",
    ]
    lines = [
        [
            name,
            str(q["stored_side"]),
            str(q["crops"]),
            f"{q['psnr_ours']:.2f}",
            f"{q['psnr_torchvision']:.2f}",
            f"{q['delta_db']:+.2f}",
            f"{q['delta_db_worst']:+.2f}",
            f"{q['us_ours']:.0f}",
            f"{q['us_torchvision']:.0f}",
        ]
        for name, q in quality.items()
    ]
    header = ["images", "shorter side", "crops", "PSNR ours", "PSNR torchvision", "difference (dB)", "worst crop"]
    return text + _table([*header, "us ours", "us torchvision"], lines)


def _decode_section(rows: list[dict]) -> list[str]:
    first = next((r for row in rows for r in row["runs"] if r), None)
    bits = (
        f" ({first['bits_per_pixel']:.1f} bits per pixel, about what a camera JPEG of that size weighs)"
        if first
        else ""
    )
    text = [
        "",
        "## Decoding 3000 x 2250 JPEGs to a 224 crop (one process)",
        "",
        f"Quality 90{bits}; each decoded image then gets the train transform (the rendered task's; the baseline's "
        "row, its own). The full decode is OpenCV's `cv2.imdecode` at full size (torchvision's `decode_image` is "
        "deprecated); the rendered task decodes with `cv2.imdecode` and its IMREAD_REDUCED flags (PIL reads the "
        "header only), the baseline's with PIL's draft. libjpeg's reduced-scale decode skips most of the inverse "
        "DCT and colour work, not the entropy decoding, which grows with the file's size: the heavier the JPEG, "
        "the smaller the gain.",
        "",
    ]
    lines = []
    for r in rows:
        run = next((x for x in r["runs"] if x), None)
        shape = f"{run['decoded'][2]} x {run['decoded'][1]}" if run else "–"
        lines.append([r["name"], *_speed_cells(r), _n(r["median"] and 1000 / r["median"], ".1f"), shape])
        lines[-1] += [_x(r.get("x_full")), _x(r.get("x_before"))]
    return text + _table(["", "samples/s", "range", "ms/sample", "decoded to", "x full", "x before"], lines)


def _train_section(rows: list[dict], s: dict, ref: str | None) -> list[str]:
    """``train`` for one epoch, rendered and the baseline's, from the folder and the cache."""
    batches = s.get("train_batches")
    epoch = f"at most {batches} batches (`train.max_batches={batches}`)" if batches else "the whole train split"
    text = [
        "",
        "## Training for one epoch (the CPU)",
        "",
        f"`python -m <package> train` (its command line's `main`, in the probe's process) for one epoch of {epoch} "
        f"on the 224 px photos, batch {s['batch_size']}, `loader.tuned=` (no `bench --quick` first), "
        f"num_workers {s['workers']}, prefetch_factor 2, persistent workers, on the CPU: the model's steps share "
        "the cores with the loader's workers. The samples/s are the epoch's samples after its first batch over "
        "the seconds after it (the first waits for the workers to start), timed alike in both versions by "
        "wrapping the project's `train_one_epoch`; *metrics.jsonl* is the `samples_per_s` the run itself "
        "reported: the rendered version's leaves the first batch's samples out (the seconds the workers take to "
        "start still count), the baseline's counts the whole epoch, so the two columns are not comparable "
        "across versions. `train.max_batches` bounds the rendered version's validation too, not the baseline's "
        "(validation is not timed here).",
        "",
    ]
    header = ["run", "samples/s", "range", "x before", "metrics.jsonl samples_per_s", "whole epoch samples/s"]
    header += ["first batch (s)", "samples an epoch", "samples/CPU-s"]
    lines = [
        [r["name"], *_speed_cells(r), _x(r.get("x_before")), _n(r.get("reported_samples_per_s_median"), ".1f")]
        + [_n(r.get("whole_epoch_samples_per_s_median"), ".1f"), _n(r.get("first_batch_s_median"), ".2f")]
        + [_n(r.get("samples_median")), _n(r["median_cpu"], ".1f")]
        for r in rows
    ]
    text += _table(header, lines)
    text += ["", f"The goal holds each rendered row at {TRAIN_FLOOR:.2f}x the baseline's same row or more."]
    return text


def _memory_section(memory: dict, workers: int, ref: str | None) -> list[str]:
    text = ["", "## Worker memory while reading the cache", ""]
    cache = memory.get(CACHE)
    if cache is None:
        return [*text, "Pending: the cache loader did not run."]
    text += [
        "Each loader worker's memory from /proc/<pid>/smaps_rollup at the first batch of its first epoch and at "
        f"the end of that epoch ({cache['samples']:.0f} samples; {cache['workers']} worker readings over the rounds "
        "for the default cache loader: median MB, and the largest growth of any worker). Anonymous memory is what a "
        "worker owns; RSS also counts the cache's file pages it has mapped, shared with the other workers through "
        "the page cache, and the batch pool's shared-memory blocks; PSS splits those among them. The folder "
        "loaders' workers, which map no cache, are the comparison.",
        "",
    ]
    names = [CACHE, *(n for n in memory if n != CACHE)]  # the default cache loader first, then as they ran
    lines = []
    for name in names:
        m = memory[name]
        keys = ("anonymous", "rss") if "folder" in name else ("anonymous", "pss", "rss")
        for key in keys:
            lines.append(
                [f"{name}: {key}", f"{m[key]['before']:.0f}", f"{m[key]['after']:.0f}", f"{m[key]['max_growth']:+.1f}"]
            )
    text += _table(["per worker", "first batch (MB)", "end of the epoch (MB)", "largest growth (MB)"], lines)
    folder = memory.get(FOLDER)
    if folder and min(cache["anonymous"]["max_growth"], folder["anonymous"]["max_growth"]) >= FLAT_MB:
        per_sample = 1024 * cache["anonymous"]["max_growth"] / (cache["samples"] / workers)
        text += [
            "",
            f"Both loaders' workers grow alike, so the growth is not the cache's: about {per_sample:.0f} KB per "
            "sample a worker produced, near the 147 KB of a 224 px sample: the workers keep memory of the "
            "batches they sent.",
        ]
    if ref and before("cache", ref) not in memory:
        text += ["", f"The baseline's cache loader ({ref}) gave no reading."]
    return text
