"""Side by side: the rendered folder, stream (SQLite) and shards loaders, and a plain WebDataset.

    .venv/bin/python benchmarks/compare_sources.py [--per-class 500] [--workers 2] [--batch-size 64]

Renders one image project per source from this checkout, writes the same synthetic images
with each project's own `sample-data` (the same bytes: folder files, SQLite rows, 8 tar shards), and
times each project's train loader alone: samples/s over ``--batches`` batches after a warm-up,
with the same num_workers, prefetch_factor, batch size and transforms. The fourth row is a
plain ``webdataset.WebDataset`` pipeline over the same shards with the same torchvision
decode and transforms, as a user would write it. Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGE = "bench_project"

# Runs inside a rendered project (PYTHONPATH=<project>/src): time its own train loader.
PROJECT_PROBE = """
import json, sys, time
from bench_project.config import load_config
from bench_project.data import build_dataset, build_loader, set_epoch
root, workers, batch_size, batches = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
cfg = load_config(None, [f"data.root={root}", f"loader.num_workers={workers}", "loader.prefetch_factor=2",
                         "loader.persistent_workers=true", f"loader.batch_size={batch_size}", "loader.tuned=''",
                         "data.image_size=64"])
loader = build_loader(build_dataset(cfg, "train"), cfg, "train")
def batch_sizes(epoch):
    set_epoch(loader, epoch)
    for batch in loader:
        yield len(batch["key"])
"""

# A plain WebDataset pipeline over the same shards, with the project's decode and transforms.
WDS_PROBE = """
import json, sys, glob, time, torch, webdataset as wds
from torchvision.io import ImageReadMode, decode_image
from torchvision.transforms import v2
root, workers, batch_size, batches = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
urls = sorted(glob.glob(f"{root}/train/*.tar"))
augment = v2.Compose([v2.RandomResizedCrop(64, scale=(0.35, 1.0), antialias=True), v2.RandomHorizontalFlip()])
def decode(sample):
    data = sample.get("jpg") or sample.get("png") or sample.get("jpeg")
    image = decode_image(torch.frombuffer(bytearray(data), dtype=torch.uint8), mode=ImageReadMode.RGB)
    return augment(image), int(sample["cls"])
dataset = (wds.WebDataset(urls, shardshuffle=len(urls), nodesplitter=wds.split_by_node, empty_check=False)
           .shuffle(1000).map(decode).batched(batch_size, partial=False))
loader = wds.WebLoader(dataset, batch_size=None, num_workers=workers, prefetch_factor=2, persistent_workers=True)
def batch_sizes(epoch):
    for images, labels in loader:
        yield len(labels)
"""

TIMER = """
warmup, times, samples, epoch, first = 3, [], 0, 0, None
start = time.perf_counter()
while len(times) < batches + warmup:
    last = time.perf_counter()
    for n in batch_sizes(epoch):
        now = time.perf_counter()
        first = first if first is not None else now - start
        times.append(now - last)
        if len(times) > warmup:
            samples += n
        last = now
        if len(times) >= batches + warmup:
            break
    epoch += 1
timed = sorted(times[warmup:])
print(json.dumps({"samples_per_s": samples / sum(timed), "ms_per_batch": 1000 * timed[len(timed) // 2],
                  "first_batch_s": first, "epochs": epoch}))
"""


def render(dest: Path, source: str) -> Path:
    from copier import run_copy

    run_copy(
        str(REPO),
        str(dest),
        data={"project_name": "bench project", "data_source": source, "data_format": "image"},
        defaults=True,
        vcs_ref="HEAD",
        quiet=True,
        skip_tasks=True,
    )
    return dest


def probe(code: str, project: Path | None, root: str, args: argparse.Namespace) -> dict:
    env = {**os.environ, "PYTHONPATH": str(project / "src") if project else ""}
    argv = [sys.executable, "-c", code + TIMER, root, str(args.workers), str(args.batch_size), str(args.batches)]
    out = subprocess.run(
        argv, env=env, capture_output=True, text=True, timeout=900, check=False, start_new_session=True
    )
    if out.returncode != 0:
        raise SystemExit(f"probe failed for {root}:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--per-class", type=int, default=500, help="train images per class (4 classes)")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--batches", type=int, default=60, help="timed batches per loader")
    p.add_argument("--repeats", type=int, default=3, help="runs per loader; the median is reported")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        projects = {s: render(tmp / s, s) for s in ("folder", "stream", "shards")}
        data = {"folder": tmp / "folder-data", "stream": tmp / "data.sqlite", "shards": tmp / "shards"}
        for source, project in projects.items():  # each project's own sample-data: the same images
            argv = ["sample-data", "--per-class", str(args.per_class), "--out", str(data[source]), "data.image_size=64"]
            env = {**os.environ, "PYTHONPATH": str(project / "src")}
            subprocess.run([sys.executable, "-m", PACKAGE, *argv], cwd=project, env=env, check=True)
        size = sum(f.stat().st_size for f in (data["folder"] / "train").rglob("*") if f.is_file())
        rows = [
            ("folder (rendered)", PROJECT_PROBE, projects["folder"], str(data["folder"])),
            ("stream/sqlite (rendered)", PROJECT_PROBE, projects["stream"], str(data["stream"])),
            ("shards (rendered)", PROJECT_PROBE, projects["shards"], str(data["shards"])),
            ("plain webdataset.WebDataset", WDS_PROBE, None, str(data["shards"])),
        ]
        print(
            f"{args.per_class * 4} train images ({size / 1e6:.1f} MB, 64 px crops), batch {args.batch_size}, "
            f"num_workers {args.workers}, prefetch_factor 2, {args.batches} timed batches, median of "
            f"{args.repeats} runs, {os.cpu_count()} CPUs\n"
        )
        print("| loader | samples/s | ms/batch (median) | first batch (s) |")
        print("| --- | ---: | ---: | ---: |")
        for name, code, project, root in rows:
            runs = sorted(
                (probe(code, project, root, args) for _ in range(args.repeats)), key=lambda r: r["samples_per_s"]
            )
            r = runs[len(runs) // 2]
            print(
                f"| {name} | {r['samples_per_s']:.0f} | {r['ms_per_batch']:.1f} | {r['first_batch_s']:.2f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
