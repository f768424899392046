"""The rendered loaders under Docker's 64 MB /dev/shm against an unlimited one, side by side, alternating.

    .venv/bin/python benchmarks/shm.py [--images 1200] [--rounds 3] [--out benchmarks/results]   # needs root

Renders the default image project (folder source) from this checkout (uncommitted changes included),
writes photos of realistic size (photos.py: 400-600 px JPEGs), packs its cache, then in each round
runs, each in a process of its own and a mount namespace of its own (``unshare -m``, a tmpfs of the
size on /dev/shm): the folder loader and the cache loader alone (224 px crops, batch 64, 2 workers,
prefetch_factor 2, persistent workers: ``loader.*`` samples/s over 40 batches after 4; the cache's
also with ``loader.batch_pool=true``) and ``train``
for one epoch of each (its ``samples_per_s``, model step included), with /dev/shm unlimited (the
host's) and 64 MB; the rows alternate their order from round to round. Then ``train`` once under
8 MB. Writes ``OUT/shm.md`` (the table, what ``train`` printed) and ``OUT/shm.json`` (every run).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import photos  # noqa: E402 (beside this script)

REPO = HERE.parent
PACKAGE = "shm_bench"
SETTINGS = ["data.image_size=224", "loader.batch_size=64", "loader.num_workers=2", "loader.prefetch_factor=2"]
SIZES = {"unlimited": None, "64 MB": "64m"}

PROBE = """
import json, os, sys, time
from shm_bench.config import load_config
from shm_bench.data import build_dataset, build_loader, set_epoch
from shm_bench.data.settings import loader_settings

def main():
    cfg = load_config(None, sys.argv[1:])
    dataset = build_dataset(cfg, "train")
    settings = loader_settings(cfg, {"train": dataset})["train"]  # /dev/shm's need checked, the pool sized
    blocks = settings.pool_blocks
    loader = build_loader(dataset, cfg, "train", settings)
    times, samples, epoch = [], 0, 0
    while len(times) < 44:
        set_epoch(loader, epoch)
        last = time.perf_counter()
        for batch in loader:
            now = time.perf_counter()
            times.append(now - last)
            samples += len(batch["key"]) if len(times) > 4 else 0
            last = now
            if len(times) >= 44:
                break
        epoch += 1
    print(json.dumps({"samples_per_s": round(samples / sum(times[4:]), 1), "blocks": blocks}))

if __name__ == "__main__":
    main()
"""


def render(dest: Path) -> Path:
    from copier import run_copy
    from copier.errors import DirtyLocalWarning

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DirtyLocalWarning)
        run_copy(str(REPO), str(dest), data={"project_name": "shm bench"}, defaults=True, vcs_ref="HEAD",
                 unsafe=False, skip_tasks=True, quiet=True)  # fmt: skip
    return dest


def under(size: str | None, argv: list[str], project: Path, timeout: float = 900) -> subprocess.CompletedProcess:
    """``argv`` with a /dev/shm of ``size`` of its own (``None``: the host's), in the project's folder."""
    env = {**os.environ, "PYTHONPATH": str(project / "src"), "PYTHONDONTWRITEBYTECODE": "1"}
    if size is not None:
        quoted = " ".join(f"'{a}'" for a in argv)
        mount = f"mount -t tmpfs -o size={size} tmpfs /dev/shm"
        argv = ["unshare", "-m", "--propagation", "private", "sh", "-c", f"{mount} && exec {quoted}"]
    return subprocess.run(argv, cwd=project, env=env, capture_output=True, text=True, timeout=timeout, check=False)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--images", type=int, default=1200)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", type=Path, default=HERE / "results")
    args = p.parse_args()
    if os.geteuid() != 0:
        sys.exit("a tmpfs on /dev/shm of its own needs root (unshare -m)")
    work = Path(tempfile.mkdtemp(prefix="shm-bench-"))
    project = render(work / "project")
    data, cache = work / "photos", work / "cache"
    photos.write_photos(data, train=args.images * 5 // 6, val=args.images // 6)
    common = [f"data.root={data}", "loader.tuned=", *SETTINGS]
    packed = under(
        None, [sys.executable, "-m", PACKAGE, "pack", "--to", "cache", "--out", str(cache), *common], project
    )
    assert packed.returncode == 0, packed.stdout + packed.stderr
    (project / "probe.py").write_text(PROBE)
    loaders = {"folder": common, "cache": [*common, f"data.cache={cache}"]}
    loaders["cache, batch pool on"] = [*loaders["cache"], "loader.batch_pool=true"]
    rows = [(kind, what, size) for kind in ("loader", "train") for what in loaders for size in SIZES]
    rows = [(kind, what, size) for kind, what, size in rows if kind == "loader" or what in ("folder", "cache")]
    runs: dict[str, list] = {f"{kind} {what}, {size}": [] for kind, what, size in rows}
    printed: dict[str, str] = {}
    for r in range(args.rounds):
        order = rows[r % len(rows) :] + rows[: r % len(rows)]
        for kind, what, size in order:
            name = f"{kind} {what}, {size}"
            if kind == "loader":
                result = under(
                    SIZES[size], [sys.executable, "probe.py", *loaders[what], "loader.persistent_workers=true"], project
                )
                value = json.loads(result.stdout.splitlines()[-1]) if result.returncode == 0 else None
            else:
                run_dir = work / f"run-{what}-{size.replace(' ', '')}-{r}"
                argv = [
                    sys.executable,
                    "-m",
                    PACKAGE,
                    "train",
                    *loaders[what],
                    f"train.run_dir={run_dir}",
                    "train.epochs=1",
                ]
                result = under(SIZES[size], argv, project)
                value = None
                if result.returncode == 0:
                    value = json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[-1])
                    printed[name] = result.stderr.strip()
            if value is None:
                print(f"{name}: failed\n{result.stdout[-2000:]}{result.stderr[-2000:]}", file=sys.stderr)
            runs[name].append(value)
            print(name, value, flush=True)
    tiny = under("8m", [sys.executable, "-m", PACKAGE, "train", *common, f"train.run_dir={work / 'run-8m'}"], project)
    printed["train folder, 8 MB"] = f"(exit {tiny.returncode}) " + (tiny.stdout + tiny.stderr).strip()
    write(args.out, runs, printed)


def _median(values: list) -> float | None:
    got = [v["samples_per_s"] for v in values if v is not None]
    return statistics.median(got) if got else None


def write(out: Path, runs: dict, printed: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "shm.json").write_text(json.dumps({"runs": runs, "printed": printed}, indent=1), encoding="utf-8")
    lines = [
        "# The loaders under Docker's 64 MB /dev/shm (benchmarks/shm.py)",
        "",
        f"Measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: 224 px crops, batch 64, 2 workers,",
        "prefetch_factor 2, persistent workers, the batch pool off (the default) unless the row says;",
        "medians of the rounds, and of each round's ratio to the unlimited run.",
        "",
        "| what | unlimited (samples/s) | 64 MB (samples/s) | 64 MB / unlimited | pool blocks a worker at 64 MB |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for kind in ("loader", "train"):
        for what in ("folder", "cache", "cache, batch pool on") if kind == "loader" else ("folder", "cache"):
            full, small = runs[f"{kind} {what}, unlimited"], runs[f"{kind} {what}, 64 MB"]
            ratios = [b["samples_per_s"] / a["samples_per_s"] for a, b in zip(full, small) if a and b]
            blocks = next((v.get("blocks") for v in small if v and "blocks" in v), "")
            ratio = f"{statistics.median(ratios):.2f}x" if ratios else "-"
            lines.append(f"| {kind} {what} | {_median(full)} | {_median(small)} | {ratio} | {blocks} |")
    lines += ["", "What `train` printed:", ""]
    for name, text in printed.items():
        lines += [f"{name}:", "", "```", text, "```", ""]
    (out / "shm.md").write_text("\n".join(lines), encoding="utf-8")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
